"""Run megatron-core on a machine without CUDA: a few overrides, applied only when CUDA is unavailable.

megatron-core 0.16.1 runs its GPTModel on CPU (gloo, ``use_cpu_initialization=True``, the local layer spec) except
for two functions on the model's path that hard-code a CUDA device, the buffers of the sequence-parallel collectives,
and its RNG tracker, which keeps CUDA generator states. Each override below replaces exactly one of them with the
same computation minus the CUDA device, for the reason written beside it. Nothing else is patched; in particular
``torch.cuda`` itself is left alone, so code that really needs CUDA still fails loudly.

Sequence parallelism allocates the outputs of its all-gather and reduce-scatter along the sequence
(``tensor_parallel.mappings``: ``_gather_along_first_dim``, ``_reduce_scatter_along_first_dim``) and the input
gradient's reduce-scatter (``tensor_parallel.layers``: ``LinearWithGradAccumulationAndAsyncCommunication.backward``,
a 100-line function) with ``device=torch.cuda.current_device()``. gloo runs both collectives on CPU tensors, so the
only change needed is that device: those two modules see ``torch`` through ``_TorchWithCpuDevice``, the same module
except that ``torch.cuda.current_device()`` is the CPU. No other module's view of torch changes.

The RNG tracker (``megatron.core.tensor_parallel.random``) gives the dropout inside tensor-parallel regions (the
attention probabilities') a seed per tensor-parallel rank, and recompute (``CheckpointFunction``) saves and restores
it so that a recomputed layer draws the same dropout masks. On CUDA its states are CUDA generator states; here they
are CPU generator states (``CpuRNGStatesTracker``): the tensors live on the CPU, so the CPU generator is the one
dropout draws from. ``CheckpointFunction`` saves the CPU state itself beside the CUDA one, so the "CUDA" state it
also saves is nothing here (``_no_device_rng_state``).

The overrides are pinned to the source of the functions they replace: ``tests/fast/megatron/test_cpu_shim.py``
fails when an upgrade of megatron-core changes either function, so a version bump cannot silently break or skip
the shim (re-read the new function, adapt the override, update ``PINNED_SOURCE_SHA256``).

What the shim does not cover, because the CPU path does not use it: megatron's DistributedDataParallel, its
optimizer and gradient clipping, and the distributed optimizer (docs/megatron.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import operator
import warnings
from collections.abc import Iterator
from functools import reduce

import torch


@contextlib.contextmanager
def quiet_megatron_warnings() -> Iterator[None]:
    """Silence the warnings megatron-core itself raises while importing and building the local-spec model: that
    Transformer Engine and Apex are missing (the local, pure-torch modules are the ones meant here) and its own
    internal deprecations (e.g. "tp_group is None"). They would repeat in every train process's log."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"megatron\.")
        warnings.filterwarnings("ignore", message=r".*(Transformer Engine|Apex) (and Apex )?(is|are) not installed")
        yield


with quiet_megatron_warnings():
    from megatron.core import utils as megatron_utils
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.tensor_parallel import layers as megatron_layers
    from megatron.core.tensor_parallel import mappings as megatron_mappings
    from megatron.core.tensor_parallel import random as megatron_random

# sha256 of inspect.getsource() of each replaced function, in megatron-core 0.16.1, and of the functions the
# tracker override relies on: recompute's save and restore of every RNG state (the CPU one included) and the
# seeding, which reaches the CPU tracker through its ``reset`` and ``add``; and of the sequence-parallel functions
# that read ``torch.cuda.current_device()`` through ``_TorchWithCpuDevice``.
PINNED_SOURCE_SHA256 = {
    "RotaryEmbedding.get_emb": "d36bc7732392e41930edc9311ccce70bafe0013ce9c1946cebcf8e916eb2c083",
    "GlobalMemoryBuffer.get_tensor": "2b843a83eb762098e280232a8a6ad2a826f66ffbddd35a3ea5447b9035310b1d",
    "CudaRNGStatesTracker.add": "e5e9ab39a7c1e085fe0b95cb0ef4e25f5c43e3ad9caf876813ef78e3f52f0eec",
    "CudaRNGStatesTracker.fork": "6821e1e397253d43b111f5cb8f7feab6301faacf24deaece01416a7c644322d5",
    "_get_cuda_rng_state": "aa26caaa069c5c4feff0f9f4e69f0f2ab6d6fc7940f71c3a6d0fe9303447d3dc",
    "_set_cuda_rng_state": "b179c9d95438b61c1d9b58e8e13cc6534f2ae2f870d991c42438de53829ed398",
    "_get_all_rng_states": "0fd22c8e723e13ee1cb1288e49de4ecc5a2e3e102cd5099aa9b6cb9e653143bd",
    "_set_all_rng_states": "ecfe91a8fe3d8a006dbaf16227191f4135e4e1cf54aa55096f83b39c77e29bb5",
    "model_parallel_cuda_manual_seed": "7423a4a62741adea516a50b3dc5f3305d0129448a42363d55cd56227c12f3da8",
    "_gather_along_first_dim": "44633fe36d60a51f5e5b3d4c6e65037ef8cb66ae1edd80046f209f3339b12e46",
    "_reduce_scatter_along_first_dim": "7322068fab71d319dd9d5f3a55a84f790e935cc9fc0130f8f8fb5bee443a78fa",
    "LinearWithGradAccumulationAndAsyncCommunication.backward":
        "b50b2ea4a1c9027040516475a8b40a0bd86ddf9e17fcb5c2c56feb3156c3ae3e",
}

# The functions the overrides replace, kept so that the pin can be checked after the shim is applied.
ORIGINALS = {
    "RotaryEmbedding.get_emb": RotaryEmbedding.get_emb,
    "GlobalMemoryBuffer.get_tensor": megatron_utils.GlobalMemoryBuffer.get_tensor,
    "CudaRNGStatesTracker.add": megatron_random.CudaRNGStatesTracker.add,
    "CudaRNGStatesTracker.fork": megatron_random.CudaRNGStatesTracker.fork,
    "_get_cuda_rng_state": megatron_random._get_cuda_rng_state,
    "_set_cuda_rng_state": megatron_random._set_cuda_rng_state,
    "_get_all_rng_states": megatron_random._get_all_rng_states,
    "_set_all_rng_states": megatron_random._set_all_rng_states,
    "model_parallel_cuda_manual_seed": megatron_random.model_parallel_cuda_manual_seed,
    "_gather_along_first_dim": megatron_mappings._gather_along_first_dim,
    "_reduce_scatter_along_first_dim": megatron_mappings._reduce_scatter_along_first_dim,
    "LinearWithGradAccumulationAndAsyncCommunication.backward":
        megatron_layers.LinearWithGradAccumulationAndAsyncCommunication.backward,
}


def source_sha256(function) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()


def _rotary_get_emb_on_cpu(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
    """``RotaryEmbedding.get_emb`` without its first statement, which moves ``inv_freq`` to
    ``torch.cuda.current_device()`` "once at the first micro-batch" and so fails without CUDA. ``inv_freq`` stays
    where ``use_cpu_initialization`` put it; the rest is the original, line for line."""
    freqs = self.get_freqs_non_repeated(max_seq_len, offset)
    # first part even vector components, second part odd vector components, 2 * dim in dimension size
    if not self.rotary_interleaved:
        emb = torch.cat((freqs, freqs), dim=-1)
    else:
        emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
    return emb[:, None, None, :]  # [seq_length, 1, 1, dim]


def _memory_buffer_get_tensor_on_cpu(self, tensor_shape, dtype, name, mem_alloc_context=None) -> torch.Tensor:
    """``GlobalMemoryBuffer.get_tensor`` allocating its reusable buffer on the CPU: the original passes
    ``device=torch.cuda.current_device()``. Attention (the local spec's baddbmm input) and the tensor-parallel
    all-gathers take their scratch tensors from this buffer."""
    required_len = reduce(operator.mul, tensor_shape, 1)
    buffer = self.buffer.get((name, dtype))
    if buffer is None or buffer.numel() < required_len:
        self.buffer[(name, dtype)] = torch.empty(required_len, dtype=dtype, device="cpu", requires_grad=False)
    return self.buffer[(name, dtype)][0:required_len].view(*tensor_shape)


class CpuRNGStatesTracker(megatron_random.CudaRNGStatesTracker):
    """megatron's RNG tracker whose named states are CPU generator states.

    ``add`` seeds a state as the original does (torch.cuda.manual_seed -> torch.manual_seed) without disturbing the
    current one; ``fork`` swaps the named state into the CPU generator for the block and back out after it, as the
    original does with the CUDA generator (nested forks restore the outer state, as there). The original's check
    that the *CPU* state did not change inside a fork is left out: here the CPU state is the forked one.
    """

    def add(self, name, seed):
        self._is_initialized = True
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        if name in self.states_:
            raise Exception(f"rng state {name} already exists")
        self.seeds_.add(seed)
        outer = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(outer)

    @contextlib.contextmanager
    def fork(self, name=megatron_random._MODEL_PARALLEL_RNG_TRACKER_NAME):
        if name not in self.states_:
            raise Exception(f"rng state {name} is not added")
        outer, outer_name = torch.get_rng_state(), self._current_state_name
        torch.set_rng_state(self.states_[name])
        self._current_state_name = name
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)
            self._current_state_name = outer_name


class _CudaWithCpuDevice:
    """``torch.cuda`` whose ``current_device()`` is the CPU; every other attribute is ``torch.cuda``'s own."""

    @staticmethod
    def current_device() -> torch.device:
        return torch.device("cpu")

    def __getattr__(self, name):
        return getattr(torch.cuda, name)


class _TorchWithCpuDevice:
    """``torch`` as the sequence-parallel modules see it: the module itself, but ``cuda`` is ``_CudaWithCpuDevice``
    (see the module docstring)."""

    cuda = _CudaWithCpuDevice()

    def __getattr__(self, name):
        return getattr(torch, name)


def _no_device_rng_state(*args, **kwargs) -> None:
    """``_get_cuda_rng_state`` / ``_set_cuda_rng_state`` without CUDA: there is no device generator to save or
    restore (their callers, recompute's ``_get_all_rng_states`` / ``_set_all_rng_states``, save and restore the CPU
    generator themselves, and the tracker's states through the tracker)."""
    return None


def install_cpu_rng_tracker() -> None:
    """Make ``CpuRNGStatesTracker`` megatron's tracker (before ``model_parallel_cuda_manual_seed`` seeds it); the
    one tracker megatron's modules and recompute ask for through ``get_cuda_rng_tracker()``."""
    if not isinstance(megatron_random._CUDA_RNG_STATE_TRACKER, CpuRNGStatesTracker):
        megatron_random._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
        megatron_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


def apply_cpu_shim() -> bool:
    """Install the overrides when CUDA is unavailable; idempotent. Returns whether the shim is in effect."""
    if torch.cuda.is_available():
        return False
    RotaryEmbedding.get_emb = _rotary_get_emb_on_cpu
    megatron_utils.GlobalMemoryBuffer.get_tensor = _memory_buffer_get_tensor_on_cpu
    megatron_random._get_cuda_rng_state = _no_device_rng_state
    megatron_random._set_cuda_rng_state = _no_device_rng_state
    megatron_mappings.torch = megatron_layers.torch = _TorchWithCpuDevice()
    install_cpu_rng_tracker()
    return True
