"""Whole (tensor-parallel size 1) Megatron states <-> one tensor-parallel rank's shards, and the gather between.

``qwen2.py`` converts whole states; a rank of a tensor-parallel (TP) group of size ``tp`` holds, of each parameter
megatron marks ``tensor_model_parallel``, the ``tp_rank``-th of ``tp`` equal chunks along its ``partition_dim``:

- ``linear_qkv`` is grouped per query group (``qwen2.py``), so a contiguous chunk along dim 0 is whole groups;
- ``linear_fc1`` is ``[gate; up]`` whole, but megatron's column-parallel SwiGLU splits each rank's output in two
  halves, so rank r holds ``[gate_r; up_r]``: gate and up are chunked separately;
- the vocabulary rows (the embedding and an untied output layer) are padded with zero rows to a multiple of
  ``tp`` first (``padded_vocab_size``), since megatron splits the vocabulary evenly; the padded logits are dropped
  before the log-softmax (``MegatronTrainModel``) and the padding is stripped on the way back.

Everything else (norms, the critic's scalar head) is replicated. Moving elements only: shard -> unshard is exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.distributed as dist

FC1_SUFFIX = "mlp.linear_fc1.weight"
VOCAB_ROWS = ("embedding.word_embeddings.weight", "output_layer.weight")


def padded_vocab_size(vocab_size: int, tensor_parallel_size: int) -> int:
    return math.ceil(vocab_size / tensor_parallel_size) * tensor_parallel_size


def partition_dims(module: torch.nn.Module) -> dict[str, int]:
    """Name -> partition dim of every tensor-parallel parameter (names as in ``state_dict()``)."""
    return {name: param.partition_dim for name, param in module.named_parameters()
            if getattr(param, "tensor_model_parallel", False)}


def shard_tensor(name: str, tensor: torch.Tensor, dim: int, rank: int, size: int, vocab_size: int) -> torch.Tensor:
    """Rank ``rank``'s shard of the whole ``tensor`` (a new tensor)."""
    if name in VOCAB_ROWS:
        padding = tensor.new_zeros(padded_vocab_size(vocab_size, size) - vocab_size, *tensor.shape[1:])
        tensor = torch.cat([tensor, padding], dim=0)
    if name.endswith(FC1_SUFFIX):
        gate, up = tensor.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]], dim=0)
    return tensor.chunk(size, dim=dim)[rank].clone()


def unshard_tensor(name: str, shards: list[torch.Tensor], dim: int, vocab_size: int) -> torch.Tensor:
    """The whole tensor from every rank's shard, in rank order (the inverse of ``shard_tensor``)."""
    if name.endswith(FC1_SUFFIX):
        halves = [shard.chunk(2, dim=0) for shard in shards]
        return torch.cat([torch.cat([gate for gate, _ in halves]), torch.cat([up for _, up in halves])], dim=0)
    whole = torch.cat(shards, dim=dim)
    return whole[:vocab_size].clone() if name in VOCAB_ROWS else whole


def shard_state(whole: Mapping[str, torch.Tensor], dims: Mapping[str, int], rank: int, size: int,
                vocab_size: int) -> dict[str, torch.Tensor]:
    return {name: shard_tensor(name, tensor, dims[name], rank, size, vocab_size) if name in dims else tensor
            for name, tensor in whole.items()}


def gather_state(native: Mapping[str, object], dims: Mapping[str, int], vocab_size: int, group) -> dict[str, object]:
    """The whole state from this rank's shards: one all-gather per tensor-parallel parameter over ``group`` (every
    rank of the group must call it, with its own shards of the same names)."""
    size = dist.get_world_size(group)
    if size == 1:
        return dict(native)
    gathered = {}
    for name in sorted(dims):  # the same order on every rank
        local = native[name].contiguous()
        pieces = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(pieces, local, group=group)
        gathered[name] = pieces
    return {name: unshard_tensor(name, gathered[name], dims[name], vocab_size) if name in dims else value
            for name, value in native.items()}


class _GatherLastDim(torch.autograd.Function):
    """megatron's ``gather_from_tensor_model_parallel_region`` (forward: all-gather along the last dim; backward:
    this rank's slice, since every rank computes the same loss from the gathered whole), on any device: megatron's
    allocates its output on ``torch.cuda.current_device()``."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, group) -> torch.Tensor:
        ctx.rank, ctx.width = dist.get_rank(group), local.shape[-1]
        pieces = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, local.contiguous(), group=group)
        return torch.cat(pieces, dim=-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad[..., ctx.rank * ctx.width : (ctx.rank + 1) * ctx.width].contiguous(), None


def gather_last_dim(local: torch.Tensor, group) -> torch.Tensor:
    """The vocabulary-parallel logits of every rank of ``group``, concatenated (autograd-aware)."""
    return local if dist.get_world_size(group) == 1 else _GatherLastDim.apply(local, group)
