"""The errors of a launch configuration miles refuses, defined in the lowest layer so configuration imports nothing
above it; ``miles.utils.errors`` re-exports them beside the run errors.

The drivers catch ``MilesConfigError`` to print one clean ``error: ...`` line and exit 2.
"""


class MilesConfigError(ValueError):
    """A launch configuration that miles refuses: the message names the value, the rule and the fix."""


class AsyncOffPolicyCorrectionError(MilesConfigError, AssertionError):
    """Async PPO without a behavior-policy correction.

    An ``AssertionError`` as well, so upstream's ``pytest.raises(AssertionError, ...)`` tests hold; it is
    raised explicitly, so ``python -O`` cannot switch the contract off.
    """
