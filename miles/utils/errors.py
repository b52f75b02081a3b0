"""Error types shared by the drivers, the validator and the runtime guard.

The drivers catch ``MilesConfigError`` to print one clean ``error: ...`` line and exit 2, and ``MilesRunError`` (a
run that started and stopped for a named reason, after saving what it could) to print one line and exit with its
status; every other exception keeps its traceback, because it is a bug rather than bad input.

``MilesConfigError`` and ``AsyncOffPolicyCorrectionError`` are defined in ``miles.config.errors``, because
configuration is the lowest layer and may import nothing of ``miles.utils`` (docs/design.md §6); they are
re-exported here so every error miles raises can be imported from this one module.
"""

from miles.config.errors import AsyncOffPolicyCorrectionError, MilesConfigError  # noqa: F401

REPORT_BUG = "This is a bug in miles, not in your flags; please report it with the run's metrics.jsonl."


class MilesRunError(RuntimeError):
    """A started run stopped for a named reason; ``run_cli`` prints ``<label>: <message>`` and exits ``exit_status``."""

    label = "error"
    exit_status = 1


class OffPolicyGuardError(MilesRunError):
    """The runtime guard found a trained batch whose denominator is not the one the correction promises."""


class DivergenceError(MilesRunError):
    """A loss, gradient norm, weight or sampling distribution became non-finite: the user's step size or data.

    ``weights_changed`` says whether the raising process had already applied a step of the diverged rollout (then
    its live weights are no rollout's, and the run cannot save them as the last finite one).
    """

    def __init__(self, message: str, weights_changed: bool = False) -> None:
        super().__init__(message)
        self.weights_changed = weights_changed

    def __reduce__(self):  # keep weights_changed through Ray's pickling
        return type(self), (str(self), self.weights_changed)


class RunInterrupted(MilesRunError):
    """SIGINT or SIGTERM stopped the run; it exits 128 + the signal's number, the shell's convention."""

    label = "stopped"

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_status = 128 + signum


class ProcessDiedError(MilesRunError):
    """One of the run's Ray processes (actor, critic, rollout engine or manager) died mid-run."""


class RolloutEngineError(MilesRunError):
    """A rollout engine failed to start, answer or load weights; the message names the engine."""
