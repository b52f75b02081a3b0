"""DAPO-style dynamic sampling (upstream's ``generate_rollout_async`` with --over-sampling-batch-size and
--dynamic-sampling-filter-path), as miles' deterministic loop.

A rollout needs B = --rollout-batch-size groups. It draws rounds of O = --over-sampling-batch-size prompts from
the prompt stream, generates every group of a round, and keeps, in prompt order, the groups the filter passes
until B are kept; upstream's rule "draw another round while kept + in flight < B" reduces to "while kept < B"
here, because a round finishes before the next is drawn. Kept groups beyond B are dropped, as upstream drops them
(its "unused samples are not stored back"). Upstream keeps the first B to *finish*, miles the first B in prompt
order: the same distribution, and reproducible. Upstream loops forever when the filter keeps too little; miles
stops once a rollout has drawn every prompt of the data and one more round (``give_up_after``).

Torch-free, and pure but for the two callables it is given: the rollout manager supplies ``draw`` (the next
prompts of the stream) and ``generate`` (one round's groups, rewards filled in).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from miles.config.hooks import load_function
from miles.rollout.filter_hub.base_types import call_dynamic_filter
from miles.utils.errors import MilesRunError


@dataclass
class DynamicSamplingResult:
    groups: list[list]  # the B kept groups, in the order they were drawn
    prompts_drawn: int  # prompts taken from the stream: rounds x O
    rounds: int
    drop_reasons: Counter = field(default_factory=Counter)  # reason -> dropped groups (reason None: not counted)
    rewards_before_filter: list[float] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """Upstream's ``rollout/dynamic_filter/drop_{reason}`` counts and ``rollout/raw_reward_unfiltered`` (the
        mean reward of every generated group, before the filter), and miles' round count."""
        metrics = {f"rollout/dynamic_filter/drop_{reason}": float(count) for reason, count in self.drop_reasons.items()}
        if self.rewards_before_filter:
            metrics["rollout/raw_reward_unfiltered"] = sum(self.rewards_before_filter) / len(self.rewards_before_filter)
        metrics["rollout/dynamic_filter/rounds"] = float(self.rounds)
        return metrics


def give_up_after(num_prompts: int, over_sampling_batch_size: int) -> int:
    """Prompts a rollout may draw before it stops: every prompt of the data once, plus one round (so a data set
    smaller than a round still gets two rounds)."""
    return num_prompts + over_sampling_batch_size


def sample_dynamically(rollout_id: int, target: int, over_sampling_batch_size: int, num_prompts: int,
                       draw: Callable[[int], list], generate: Callable[[list, int], list[list]],
                       keep: Callable[[list], object], filter_name: str) -> DynamicSamplingResult:
    """Rounds of ``draw(O)`` -> ``generate(prompts, round)`` -> ``keep(group)`` until ``target`` groups passed.

    ``keep`` returns the filter's verdict (``call_dynamic_filter``); a rollout that draws ``give_up_after``
    prompts without filling is a ``MilesRunError`` naming the counts and the fix.
    """
    result = DynamicSamplingResult(groups=[], prompts_drawn=0, rounds=0)
    while len(result.groups) < target:
        if result.prompts_drawn >= give_up_after(num_prompts, over_sampling_batch_size):
            raise MilesRunError(
                f"rollout {rollout_id}: {result.rounds} rounds drew {result.prompts_drawn} prompts (every prompt of "
                f"the {num_prompts} once, and one round more), but only {len(result.groups)} of the "
                f"--rollout-batch-size {target} groups passed --dynamic-sampling-filter-path {filter_name} "
                f"(dropped: {dict(result.drop_reasons) or 'no reasons given'}). The filter rejects nearly every "
                "group: use easier prompts, raise --n-samples-per-prompt so groups spread, or change the filter."
            )
        groups = generate(draw(over_sampling_batch_size), result.rounds)
        result.prompts_drawn += over_sampling_batch_size
        result.rounds += 1
        for group in groups:
            result.rewards_before_filter.extend(sample.reward for sample in group)
            verdict = keep(group)
            if not verdict.keep:
                if verdict.reason:
                    result.drop_reasons[verdict.reason] += 1
            elif len(result.groups) < target:
                result.groups.append(group)
    return result


UPSTREAM_FILTER = "miles.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"


def load_dynamic_filter(path: str | None):
    """The function --dynamic-sampling-filter-path names (None: keep every group); a bad path is refused."""
    return load_function("--dynamic-sampling-filter-path", path, UPSTREAM_FILTER) if path else None


def filter_verdict(fn, args) -> Callable[[list], object]:
    """``keep`` for ``sample_dynamically``: the user's filter called as upstream calls it."""
    return lambda group: call_dynamic_filter(fn, args, group)
