"""A train role's ranks: how many, where each goes, and the startup rules (pure Python, imports nothing heavy).

World size = nodes x ranks per node; the tensor-parallel (TP) groups are consecutive ranks, so a role's data-
parallel (DP) size is world / TP and rank r is TP rank ``r % TP`` of DP rank ``r // TP`` (megatron's order). Rank
r lives in bundle ``r // ranks_per_node`` of its role's placement group, one bundle per node.

On a machine without GPUs, a "GPU" of ``--actor-num-gpus-per-node`` counts one train process with one CPU bundle.

In configuration because the launch's validation checks these rules before anything starts; ``miles.ranks``
builds the role's processes from the layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from miles.config.errors import MilesConfigError


@dataclass(frozen=True)
class RoleLayout:
    role: str  # "actor" or "critic"
    num_nodes: int
    ranks_per_node: int
    tensor_parallel_size: int = 1

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.ranks_per_node

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // self.tensor_parallel_size

    def bundle_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    @classmethod
    def from_args(cls, args, role: str) -> RoleLayout:
        return cls(role, getattr(args, f"{role}_num_nodes"), getattr(args, f"{role}_num_gpus_per_node"),
                   args.tensor_model_parallel_size)


def train_layouts(args) -> list[RoleLayout]:
    """The actor's layout and, for PPO, the critic's."""
    return [RoleLayout.from_args(args, role) for role in ("actor", "critic") if role == "actor" or args.use_critic]


SIZES = ("actor_num_nodes", "actor_num_gpus_per_node", "critic_num_nodes", "critic_num_gpus_per_node",
         "tensor_model_parallel_size", "global_batch_size", "micro_batch_size")


def check_rank_layout(args) -> None:
    """The rules between the ranks' flags, each a ``MilesConfigError`` naming the value, the rule and the fix.

    Each size is at least 1, and the pipeline size 1, by ``miles.config.flag_rules``. A size that is not a number
    (miles-check's placeholder for an unresolved shell word) leaves the rules it enters unjudged.
    """
    if not all(isinstance(getattr(args, name), int) for name in SIZES):
        return
    tp = args.tensor_model_parallel_size
    if tp > 1 and args.train_backend != "megatron":
        raise MilesConfigError(
            f"--tensor-model-parallel-size is {tp}, but tensor parallelism needs --train-backend megatron (the torch "
            f"backend trains a whole Hugging Face model per rank). Add --train-backend megatron, or pass "
            "--tensor-model-parallel-size 1 and use data parallelism."
        )
    for layout in train_layouts(args):
        _check_role(args, layout)


def _check_role(args, layout: RoleLayout) -> None:
    role, tp, world = layout.role, layout.tensor_parallel_size, layout.world_size
    where = (f"the {role} has --{role}-num-nodes {layout.num_nodes} x --{role}-num-gpus-per-node "
             f"{layout.ranks_per_node} = {world} rank(s)")
    if world % tp:
        raise MilesConfigError(
            f"{where}, which --tensor-model-parallel-size {tp} does not divide (every tensor-parallel group needs "
            f"{tp} ranks). Pick a number of ranks that is a multiple of {tp}, or a tensor-parallel size dividing {world}."
        )
    dp, global_batch, micro = layout.data_parallel_size, args.global_batch_size, args.micro_batch_size
    if args.use_dynamic_batch_size:
        micro = 1  # --micro-batch-size is ignored for training: the token budget cuts the micro-batches
    if global_batch % dp or (global_batch // dp) % min(micro, global_batch // dp):
        raise MilesConfigError(
            f"--global-batch-size {global_batch} is not divisible by the data-parallel size {dp} ({where}, "
            f"tensor-parallel size {tp}) x --micro-batch-size {micro}: every data-parallel rank takes "
            f"{global_batch} / {dp} samples of each step in whole micro-batches (upstream's rule; a micro-batch "
            "larger than a rank's share is one pass over it). " + _batch_fix(global_batch, dp, micro)
        )


def _batch_fix(global_batch: int, dp: int, micro: int) -> str:
    if global_batch % dp:
        return (f"Pick a --global-batch-size (or --num-steps-per-rollout) giving a multiple of {dp} samples per "
                "step, or another number of ranks.")
    per_rank = global_batch // dp
    fitting = max(size for size in range(1, min(micro, per_rank) + 1) if per_rank % size == 0)
    return f"Pass --micro-batch-size {fitting}."
