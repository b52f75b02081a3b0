"""DAPO's dynamic-sampling filter (Yu et al. 2025, https://arxiv.org/abs/2503.14476, eq. 11): keep a group only
when its rewards are not all equal, because a group of equal rewards has zero GRPO advantage and no gradient."""

from __future__ import annotations

import math
import statistics

from miles.rollout.filter_hub.base_types import DynamicFilterOutput

__all__ = ["check_reward_nonzero_std"]

STD_THRESHOLD = 1e-8  # upstream's: a float64 std above it counts as spread


def reward_std(rewards: list[float]) -> float:
    """The sample standard deviation sqrt(sum (r - mean)^2 / (n - 1)) in float64, as ``torch.std`` (unbiased);
    NaN for one reward, as torch gives, so a group of one never passes."""
    return statistics.stdev(rewards) if len(rewards) >= 2 else math.nan


def check_reward_nonzero_std(args, samples: list, **kwargs) -> DynamicFilterOutput:
    """Keep the group when std(rewards) > 1e-8; a dropped group's reason is ``zero_std_{reward rounded to 0.1}``
    (upstream's), so the log shows e.g. ``rollout/dynamic_filter/drop_zero_std_1.0`` for groups all correct."""
    rewards = [sample.get_reward_value(args) for sample in samples]
    keep = reward_std(rewards) > STD_THRESHOLD  # NaN > x is False
    return DynamicFilterOutput(keep=keep, reason=None if keep else f"zero_std_{round(rewards[0], 1)}")
