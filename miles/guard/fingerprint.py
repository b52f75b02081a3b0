"""The fingerprint of a set of weights: an exact hash, computed the same way by the trainer (at each push, and from a
--keep-old-actor snapshot) and by the rollout engine (from the weights it actually loaded), so the runtime guard
checks the weights themselves, not a label.

Two steps, kept apart so that an engine holding another layout can take part:

1. ``digest_table``: per tensor name, the tensor's dtype, shape and the 128-bit XXH3 hash of its bytes (row-major,
   as ``tensor.contiguous()`` lays them out). An engine in a fused or padded layout can report its own table and an
   adapter can map HF tensors into that layout (concatenating q/k/v, zero-padding the vocabulary) and re-key them
   before comparing (the SGLang engine does this with SGLang's own SHA-256 checker, ``rollout/sglang_layout.py``).
2. ``combine_digests``: one XXH3-128 over the table's lines in sorted-name order, the value stamped on samples.

Why XXH3-128 and not SHA-256: the guard looks for bugs (a wrong, stale, swapped or partly loaded tensor), not for an
adversary forging weights, so a non-cryptographic hash with 128-bit output is enough, and it hashes about 8x faster
on this CPU (10-13 GB/s against SHA-256's 1.4 GB/s with SHA-NI, one core; docs/benchmarks.md): two hashes per
rollout under --keep-old-actor stay a small part of a step, and a 7B model's push is hashed in about a second.

The push is bit-exact (the torch engine loads the trainer's tensors as they are), so an exact hash is available on
both sides: any change of any byte, of a name, a dtype or a shape changes the fingerprint (swapped or permuted
tensors, a transpose, one ulp, two errors that cancel in a sum, a tensor missing or extra). It proves nothing about
weights changed after they were hashed, or about an engine that reports a table it did not compute.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import torch
import xxhash


class TensorDigest(NamedTuple):
    dtype: str  # e.g. "torch.float32"
    shape: tuple[int, ...]
    digest: str  # hex XXH3-128 of the tensor's row-major bytes


DigestTable = dict[str, TensorDigest]


def tensor_digest(tensor: torch.Tensor) -> TensorDigest:
    """dtype, shape and XXH3-128 of the bytes of ``tensor`` in row-major order (a transposed view hashes as the
    transposed matrix it shows; a GPU tensor is copied to the CPU first)."""
    return TensorDigest(str(tensor.dtype), tuple(tensor.shape), xxhash.xxh3_128_hexdigest(_row_major_bytes(tensor)))


def _row_major_bytes(tensor: torch.Tensor):
    """A buffer of the tensor's bytes in row-major order, without a copy where it is contiguous on the CPU."""
    data = tensor.detach()
    if data.device.type != "cpu":
        data = data.cpu()
    if not data.is_contiguous():
        data = data.contiguous()
    if data.dtype in _NUMPY_DTYPES:
        return data.numpy()  # numpy's buffer protocol: the same bytes, no per-byte view to build
    return data.reshape(-1).view(torch.uint8).numpy()  # bfloat16, float8...: their raw bytes


_NUMPY_DTYPES = frozenset({torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
                           torch.int8, torch.uint8, torch.bool})


def digest_table(state_dict_or_model: Mapping[str, torch.Tensor] | torch.nn.Module) -> DigestTable:
    """Per tensor name of the mapping (or of ``model.state_dict()``), its ``TensorDigest``. Tied weights appear under
    both names, on both sides. Entries that are not tensors (megatron's ``_extra_state``, None or bytes of
    transformer-engine metadata, no weights) are left out."""
    if isinstance(state_dict_or_model, torch.nn.Module):
        state_dict_or_model = state_dict_or_model.state_dict()
    with torch.no_grad():
        return {name: tensor_digest(tensor) for name, tensor in state_dict_or_model.items()
                if isinstance(tensor, torch.Tensor)}


def combine_digests(table: Mapping[str, TensorDigest]) -> str:
    """fingerprint = XXH3-128 of the lines ``name dtype shape digest``, one per tensor, in sorted-name order (the
    order of a dict never matters; a missing, extra or renamed tensor does)."""
    lines = (f"{name}\t{d.dtype}\t{list(d.shape)}\t{d.digest}\n" for name, d in sorted(table.items()))
    return xxhash.xxh3_128_hexdigest("".join(lines).encode())


def weights_fingerprint(state_dict_or_model: Mapping[str, torch.Tensor] | torch.nn.Module) -> str:
    """``combine_digests(digest_table(...))``: a 32-character hex string, equal iff (up to 128-bit hash collisions) the
    same names hold tensors of the same dtype, shape and bytes."""
    return combine_digests(digest_table(state_dict_or_model))


def differing_tensors(expected: Mapping[str, TensorDigest], actual: Mapping[str, TensorDigest]) -> list[str]:
    """The names whose digests differ between two tables, each marked changed, missing or extra, sorted by name."""
    names = sorted(set(expected) | set(actual))
    return [f"{name} ({'missing' if name not in actual else 'extra' if name not in expected else 'changed'})"
            for name in names if expected.get(name) != actual.get(name)]


def weights_are_finite(state_dict: Mapping[str, torch.Tensor]) -> bool:
    """Every floating-point weight is finite (a hash cannot say: NaN weights hash like any others).

    The sum of every tensor's sum is finite when all elements are (NaN and ±inf propagate; the outer sum is a
    float64 over a few hundred terms), and one reduction per tensor is about 40x cheaper than ``isfinite(t).all()``;
    only a non-finite total, which finite elements can also give by overflowing, is confirmed element by element."""
    with torch.no_grad():
        floating = [t for t in state_dict.values() if t.is_floating_point()]
        return math.isfinite(sum(float(t.sum()) for t in floating)) or all(bool(torch.isfinite(t).all())
                                                                          for t in floating)
