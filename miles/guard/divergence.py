"""Divergence: a non-finite number stops the run where it first appears, as the user's problem, not a miles bug.

Checked, each for free (a value already computed):
- in a train process's optimizer step, the step's loss and gradient norm, *before* ``optimizer.step()`` applies
  them, so no non-finite gradient ever reaches the weights;
- at each weight push, every weight of the actor (``torch.isfinite`` per tensor, one pass beside the fingerprint's
  hash, which cannot tell: NaN weights hash like any others);
- in a rollout engine, each sampling step's log-probabilities (weights that are huge but finite can still give
  non-finite logits), before ``torch.multinomial`` would fail on them.

The run then saves the last rollout that trained with finite numbers (with ``--save``) and exits 1 with one line.
"""

from __future__ import annotations

import math

from miles.utils.errors import DivergenceError

LIKELY_FIXES = (
    "the training diverged: lower --lr, keep --clip-grad finite (default 1.0), or check the rewards "
    "(--rm-type / --custom-rm-path) and --entropy-coef / --kl-loss-coef"
)


def check_finite_step(where: str, step: int, loss: float, grad_norm: float) -> None:
    """Before optimizer step ``step`` (from 0) of a rollout: its summed loss and gradient norm are finite."""
    for metric, value in (("loss", loss), ("gradient norm", grad_norm)):
        if not math.isfinite(value):
            raise DivergenceError(
                f"{where}: the {metric} is {value} at optimizer step {step + 1}, before it was applied; {LIKELY_FIXES}.",
                weights_changed=step > 0,
            )


def check_finite_weights(where: str, all_finite: bool) -> None:
    """The pushed weights are finite (``miles.guard.fingerprint.weights_are_finite``)."""
    if not all_finite:
        raise DivergenceError(
            f"{where}: the actor's weights are no longer finite (NaN or infinity in at least one tensor); "
            f"{LIKELY_FIXES}.",
            weights_changed=True,
        )


def check_finite_sampling(all_finite: bool) -> None:
    """A rollout engine's next-token log-probabilities are finite (the caller names the rollout and the version)."""
    if not all_finite:
        raise DivergenceError(
            f"the rollout engine's next-token probabilities are not finite (the weights give infinite logits); "
            f"{LIKELY_FIXES}."
        )
