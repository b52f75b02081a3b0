"""Run megatron-core on a machine without CUDA: two overrides, applied only when CUDA is unavailable.

megatron-core 0.16.1 runs its GPTModel on CPU (gloo, ``use_cpu_initialization=True``, the local layer spec) except
for two functions on the model's path that hard-code a CUDA device. Each override below replaces exactly one of
them with the same computation minus the CUDA device, for the reason written beside it. Nothing else is patched;
in particular ``torch.cuda`` is left alone, so code that really needs CUDA still fails loudly.

The overrides are pinned to the source of the functions they replace: ``tests/fast/megatron/test_cpu_shim.py``
fails when an upgrade of megatron-core changes either function, so a version bump cannot silently break or skip
the shim (re-read the new function, adapt the override, update ``PINNED_SOURCE_SHA256``).

What the shim does not cover, because the CPU path does not use it: megatron's DistributedDataParallel, its
optimizer and gradient clipping, the distributed optimizer and sequence parallelism (docs/megatron.md).
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

# sha256 of inspect.getsource() of each replaced function, in megatron-core 0.16.1.
PINNED_SOURCE_SHA256 = {
    "RotaryEmbedding.get_emb": "d36bc7732392e41930edc9311ccce70bafe0013ce9c1946cebcf8e916eb2c083",
    "GlobalMemoryBuffer.get_tensor": "2b843a83eb762098e280232a8a6ad2a826f66ffbddd35a3ea5447b9035310b1d",
}

# The functions the overrides replace, kept so that the pin can be checked after the shim is applied.
ORIGINALS = {
    "RotaryEmbedding.get_emb": RotaryEmbedding.get_emb,
    "GlobalMemoryBuffer.get_tensor": megatron_utils.GlobalMemoryBuffer.get_tensor,
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


def apply_cpu_shim() -> bool:
    """Install the overrides when CUDA is unavailable; idempotent. Returns whether the shim is in effect."""
    if torch.cuda.is_available():
        return False
    RotaryEmbedding.get_emb = _rotary_get_emb_on_cpu
    megatron_utils.GlobalMemoryBuffer.get_tensor = _memory_buffer_get_tensor_on_cpu
    return True
