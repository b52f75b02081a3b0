"""The parallel layout of this train process, at upstream's path: ``GroupInfo``, ``ParallelState`` and the
process-wide ``set_parallel_state`` / ``get_parallel_state``.

Each rank process sets it once, when its train process is built (``_TrainProcess``), from the groups
``miles.ranks`` joined it to (docs/ranks.md); the step loop's data-parallel hooks, the context-parallel helpers
(``cp_utils``) and upstream's TIS hooks read it from there. miles has tensor and data parallelism; context,
pipeline and expert parallelism are one-rank groups (``GroupInfo(rank=0, size=1, group=None)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist


@dataclass(frozen=True)
class GroupInfo:
    """This process's rank in one process group, the group's size, and the group (None for a one-rank group)."""

    rank: int
    size: int
    group: Any = None


TRIVIAL_GROUP = GroupInfo(rank=0, size=1, group=None)


@dataclass(frozen=True)
class ParallelState:
    """The groups of upstream's layout. ``intra_dp`` is the data-parallel group; ``intra_dp_cp`` the data- and
    context-parallel group (the same here: context parallelism has one rank); ``indep_dp`` upstream's independent
    data parallelism (a one-rank group here)."""

    intra_dp: GroupInfo
    intra_dp_cp: GroupInfo
    cp: GroupInfo
    tp: GroupInfo
    pp: GroupInfo
    ep: GroupInfo
    etp: GroupInfo
    indep_dp: GroupInfo


_parallel_state: ParallelState | None = None


def set_parallel_state(state: ParallelState) -> None:
    global _parallel_state
    _parallel_state = state


def get_parallel_state() -> ParallelState:
    if _parallel_state is None:
        raise RuntimeError(
            "the parallel state of this process is not set: a train process sets it when it is built; outside one "
            "(a test, a script), call set_parallel_state(single_process_state()) first."
        )
    return _parallel_state


def single_process_state() -> ParallelState:
    """One process: every group has one rank."""
    return ParallelState(*([TRIVIAL_GROUP] * 8))


def process_parallel_state(tensor_parallel_size: int = 1) -> ParallelState:
    """The layout of this process from the groups it joined: data parallelism over the default group without
    tensor parallelism, megatron's tensor- and data-parallel groups with it; a process outside a group is one rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return single_process_state()
    if tensor_parallel_size == 1:
        tp, dp = TRIVIAL_GROUP, GroupInfo(dist.get_rank(), dist.get_world_size(), dist.group.WORLD)
    else:
        from megatron.core import parallel_state as mpu

        tp = GroupInfo(mpu.get_tensor_model_parallel_rank(), mpu.get_tensor_model_parallel_world_size(),
                       mpu.get_tensor_model_parallel_group())
        dp = GroupInfo(mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size(),
                       mpu.get_data_parallel_group())
    return ParallelState(intra_dp=dp, intra_dp_cp=dp, cp=TRIVIAL_GROUP, tp=tp, pp=TRIVIAL_GROUP, ep=TRIVIAL_GROUP,
                         etp=TRIVIAL_GROUP, indep_dp=TRIVIAL_GROUP)
