"""What a data-parallel (DP) rank does differently in the step loop, as one small object the loop calls.

Every rank holds the whole rollout and computes each optimizer step's divisor over the step's whole batch (so the
loss is the single-process loss); it backpropagates only its slice of the step's samples, the gradients are summed
over the DP group before the clip (so every rank clips and steps the same gradient, the single-process one), and
the sample-weighted metric totals are summed over the group before they are averaged. ``SingleRank`` is the same
object for one process (the whole step, nothing to reduce), so the loop never branches on the rank.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


class SingleRank:
    """One process: it takes every sample and owns the checkpoint."""

    rank = 0
    size = 1

    @property
    def writes_checkpoint(self) -> bool:
        """DP replicas hold identical weights and optimizer states: the first one writes them."""
        return self.rank == 0

    def local_indices(self, step: list[int]) -> list[int]:
        return step

    def reduce_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        pass

    def sum_totals(self, totals: dict[str, float]) -> dict[str, float]:
        return totals

    def merged(self, part: dict) -> dict:
        """The union of every rank's ``part`` (dicts keyed by sample index)."""
        return part


class DataParallelRank(SingleRank):
    """Rank ``rank`` of a DP group of ``size`` ranks."""

    def __init__(self, rank: int, size: int, group) -> None:
        self.rank, self.size, self.group = rank, size, group

    def local_indices(self, step: list[int]) -> list[int]:
        """A contiguous ``len(step) / size`` slice (the validator makes every step a multiple of the DP size)."""
        share = len(step) // self.size
        return step[self.rank * share : (self.rank + 1) * share]

    def reduce_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Sum the gradients over the group in one flat all-reduce (every rank's model has the same parameters)."""
        grads = [p.grad for p in parameters if p.grad is not None]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=self.group)
        for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(reduced)

    def sum_totals(self, totals: dict[str, float]) -> dict[str, float]:
        names = sorted(totals)  # the same metric names on every rank: the same loss code ran
        device = "cuda" if torch.cuda.is_available() else "cpu"  # nccl reduces CUDA tensors only
        values = torch.tensor([totals[name] for name in names], dtype=torch.float64, device=device)
        dist.all_reduce(values, group=self.group)
        return dict(zip(names, values.tolist(), strict=True))

    def merged(self, part: dict) -> dict:
        parts: list[dict | None] = [None] * self.size
        dist.all_gather_object(parts, part, group=self.group)
        return {key: value for each in parts for key, value in each.items()}


def data_parallel_rank(state):
    """This process's DP hooks from its ``ParallelState`` (``miles.backends.training_utils.parallel``):
    ``SingleRank`` unless its data-parallel group has several ranks."""
    dp = state.intra_dp
    return SingleRank() if dp.size == 1 else DataParallelRank(dp.rank, dp.size, dp.group)
