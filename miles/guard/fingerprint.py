"""The fingerprint of a set of weights: an exact hash, computed the same way by the trainer (at each push, and from a
--keep-old-actor snapshot) and by the rollout engine (from the weights it actually loaded), so the runtime guard
checks the weights themselves, not a label.

Two steps, kept apart so that an engine holding another layout can take part:

1. ``digest_table``: per tensor name, the tensor's dtype, shape and the SHA-256 of its bytes (row-major, as
   ``tensor.contiguous()`` lays them out). SHA-256 of the bytes alone is what SGLang's weight checker returns per
   tensor, so an engine in a fused or padded layout can report its table and an adapter can map HF tensors into
   that layout (concatenating q/k/v, zero-padding the vocabulary) and re-key them before comparing.
2. ``combine_digests``: one SHA-256 over the table's lines in sorted-name order, the value stamped on samples.

The push is bit-exact (the torch engine loads the trainer's tensors as they are), so an exact hash is available on
both sides: any change of any byte, of a name, a dtype or a shape changes the fingerprint (swapped or permuted
tensors, a transpose, one ulp, two errors that cancel in a sum, a tensor missing or extra). It proves nothing about
weights changed after they were hashed, or about an engine that reports a table it did not compute.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import NamedTuple

import torch


class TensorDigest(NamedTuple):
    dtype: str  # e.g. "torch.float32"
    shape: tuple[int, ...]
    sha256: str  # hex SHA-256 of the tensor's row-major bytes


DigestTable = dict[str, TensorDigest]


def tensor_digest(tensor: torch.Tensor) -> TensorDigest:
    """dtype, shape and SHA-256 of the bytes of ``tensor`` in row-major order (a transposed view hashes as the
    transposed matrix it shows; a GPU tensor is copied to the CPU first)."""
    flat = tensor.detach().contiguous().reshape(-1)
    data = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat  # bytes, without converting the values
    return TensorDigest(str(tensor.dtype), tuple(tensor.shape), hashlib.sha256(data.cpu().numpy().data).hexdigest())


def digest_table(state_dict_or_model: Mapping[str, torch.Tensor] | torch.nn.Module) -> DigestTable:
    """Per tensor name of the mapping (or of ``model.state_dict()``), its ``TensorDigest``. Tied weights appear under
    both names, on both sides."""
    if isinstance(state_dict_or_model, torch.nn.Module):
        state_dict_or_model = state_dict_or_model.state_dict()
    with torch.no_grad():
        return {name: tensor_digest(tensor) for name, tensor in state_dict_or_model.items()}


def combine_digests(table: Mapping[str, TensorDigest]) -> str:
    """fingerprint = SHA-256 of the lines ``name dtype shape sha256``, one per tensor, in sorted-name order (the
    order of a dict never matters; a missing, extra or renamed tensor does)."""
    lines = (f"{name}\t{d.dtype}\t{list(d.shape)}\t{d.sha256}\n" for name, d in sorted(table.items()))
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def weights_fingerprint(state_dict_or_model: Mapping[str, torch.Tensor] | torch.nn.Module) -> str:
    """``combine_digests(digest_table(...))``: a 64-character hex string, equal iff (up to SHA-256 collisions) the
    same names hold tensors of the same dtype, shape and bytes."""
    return combine_digests(digest_table(state_dict_or_model))


def differing_tensors(expected: Mapping[str, TensorDigest], actual: Mapping[str, TensorDigest]) -> list[str]:
    """The names whose digests differ between two tables, each marked changed, missing or extra, sorted by name."""
    names = sorted(set(expected) | set(actual))
    return [f"{name} ({'missing' if name not in actual else 'extra' if name not in expected else 'changed'})"
            for name in names if expected.get(name) != actual.get(name)]


def weights_are_finite(state_dict: Mapping[str, torch.Tensor]) -> bool:
    """Every floating-point weight is finite (a hash cannot say: NaN weights hash like any others).

    A tensor's sum is finite when all its elements are (NaN and ±inf propagate), and one reduction is about 40x
    cheaper than ``isfinite(t).all()``; only a non-finite sum, which finite elements can also give by overflowing,
    is confirmed element by element."""
    with torch.no_grad():
        return all(bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())
                   for t in state_dict.values() if t.is_floating_point())


def short(fingerprint: str | None) -> str:
    """The first 12 hex digits, enough to tell two fingerprints apart in an error message."""
    return "none" if fingerprint is None else fingerprint[:12]
