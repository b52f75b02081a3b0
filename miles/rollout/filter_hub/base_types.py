"""What a dynamic-sampling filter returns, as upstream's ``base_types`` (torch-free: the rollout manager imports it).

A filter is ``fn(args, samples, **kwargs)`` over one group (the ``n_samples_per_prompt`` samples of a prompt) and
returns ``DynamicFilterOutput(keep, reason)``; a bare bool is accepted as upstream's legacy form. A dropped group's
``reason`` names its ``rollout/dynamic_filter/drop_{reason}`` counter (no reason: dropped, not counted).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FilterOutput:
    keep: bool
    reason: str | None = None


DynamicFilterOutput = FilterOutput


def call_dynamic_filter(fn, args, samples: list, **kwargs) -> FilterOutput:
    """``fn``'s verdict on one group as a ``FilterOutput`` (no filter keeps every group)."""
    if fn is None:
        return FilterOutput(keep=True)
    output = fn(args, samples, **kwargs)
    return output if isinstance(output, FilterOutput) else FilterOutput(keep=bool(output))
