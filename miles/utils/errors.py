"""Error types shared by the drivers, the validator and the runtime guard.

The drivers catch ``MilesConfigError`` (and only it) to print one clean ``error: ...`` line and exit 2;
every other exception keeps its traceback, because it is a bug rather than bad input.
"""


REPORT_BUG = "This is a bug in miles, not in your flags; please report it with the run's metrics.jsonl."


class MilesConfigError(ValueError):
    """A launch configuration that miles refuses: the message names the value, the rule and the fix."""


class AsyncOffPolicyCorrectionError(MilesConfigError, AssertionError):
    """Async PPO without a behavior-policy correction.

    An ``AssertionError`` as well, so upstream's ``pytest.raises(AssertionError, ...)`` tests hold; it is
    raised explicitly, so ``python -O`` cannot switch the contract off.
    """


class OffPolicyGuardError(RuntimeError):
    """The runtime guard found a trained batch whose denominator is not the one the correction promises."""
