"""The process group and megatron's parallel state for a train process, the tensor-parallel gradient sum of
replicated parameters that only see part of the activations, and the gradient-norm clip.

A train process is one rank of its role: ``miles.ranks`` has joined it to the role's process group before the model
is built (docs/ranks.md); a process outside a role (a test) gets a one-rank group with an in-process store, so no
port is opened. The backend is gloo without CUDA and nccl with it. The clip is written for
tensor-parallel shards from the start: megatron's own clip needs CUDA tensors, so the norm is computed here over
the parameters each rank owns and summed over the model-parallel group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from miles.backends.megatron_backend.cpu_shim import apply_cpu_shim
from miles.ranks.process_group import COLLECTIVE_TIMEOUT_S
from megatron.core import parallel_state
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed


@dataclass(frozen=True)
class Parallelism:
    """How a role's model is split over its tensor-parallel ranks: --tensor-model-parallel-size and
    --sequence-parallel (the layers' activations outside attention and the MLP split along the sequence as well)."""

    tensor_parallel_size: int = 1
    sequence_parallel: bool = False

    @property
    def splits_sequence(self) -> bool:
        """Sequence parallelism over one rank splits nothing: it is the model without it (megatron's config refuses
        it there, and upstream's Megatron arguments turn it off at tensor-parallel size 1)."""
        return self.sequence_parallel and self.tensor_parallel_size > 1


def initialize_model_parallel(seed: int, tensor_model_parallel_size: int = 1) -> torch.device:
    """Set up torch.distributed, megatron's parallel state and its RNG tracker once per process; return the device.

    Without CUDA the RNG tracker is the CPU shim's (``cpu_shim.CpuRNGStatesTracker``: CPU generator states, seeded
    here by megatron's own function), so dropout and recompute follow the model-parallel seeds as on CUDA.
    """
    cuda = torch.cuda.is_available()
    apply_cpu_shim()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        # megatron's own groups (tensor- and data-parallel) get the same bound as the rank's default group
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tensor_model_parallel_size,
                                                 distributed_timeout_minutes=COLLECTIVE_TIMEOUT_S / 60)
    model_parallel_cuda_manual_seed(seed)
    return torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")


# Replicated on every tensor-parallel rank, but each rank applies them to its own heads only (Qwen3's per-head q/k
# RMSNorm), so each rank's gradient is a partial sum. megatron's finalize_model_grads sums the same names.
PARTIAL_GRADIENT_SUFFIXES = ("q_layernorm.weight", "k_layernorm.weight")


def sum_partial_gradients(named_parameters) -> None:
    """Add up, over the tensor-parallel group, the gradients that each rank holds only a part of.

    For a replicated weight w applied on rank r to its part p(r) of the work: dL/dw = sum_r sum_{i in p(r)} dL_i/dw,
    while rank r's backward computes only its inner sum. The parts are a rank's heads (Qwen3's q/k norms) or, under
    sequence parallelism, its slice of the sequence (every norm outside attention, marked ``sequence_parallel``, as
    megatron marks them). After the all-reduce every rank holds the whole gradient, once, so the replicas stay
    equal after the step. A no-op at tensor-parallel size 1.
    """
    group = parallel_state.get_tensor_model_parallel_group()
    if group.size() == 1:
        return
    for name, param in named_parameters:
        partial = name.endswith(PARTIAL_GRADIENT_SUFFIXES) or getattr(param, "sequence_parallel", False)
        if param.grad is not None and partial:
            dist.all_reduce(param.grad, group=group)


def clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float) -> float:
    """torch's ``clip_grad_norm_`` over a tensor-parallel model: returns the global 2-norm before clipping.

    norm = sqrt(sum over the model-parallel group of sum over owned grads of ||g||^2), where a rank owns its
    tensor-parallel shards and, of the replicated parameters (norms, biases of row-parallel layers), only TP rank 0
    counts them; every gradient is then scaled by min(1, max_norm / (norm + 1e-6)), torch's coefficient.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    owned = [p.grad for p in parameters if p.grad is not None and param_is_not_tensor_parallel_duplicate(p)]
    squared = torch.stack([torch.linalg.vector_norm(g) ** 2 for g in owned]).sum() if owned else torch.zeros(())
    if parallel_state.get_model_parallel_group().size() > 1:
        dist.all_reduce(squared, group=parallel_state.get_model_parallel_group())
    norm = math.sqrt(float(squared))
    coefficient = min(1.0, max_norm / (norm + 1e-6))
    if coefficient < 1.0:
        for grad in grads:
            grad.mul_(coefficient)
    return norm
