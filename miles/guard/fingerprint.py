"""A float64 checksum of model weights, computed the same way by the trainer (at each push) and by the rollout
engine (from the weights it actually loaded), so the runtime guard checks the weights themselves, not a label.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

_ROW = 4096  # elements summed per row; each row is reduced by one thread, whatever the thread count


def weights_fingerprint(state_dict_or_model: Mapping[str, torch.Tensor] | torch.nn.Module) -> float:
    """fingerprint = Σ over every tensor of ``state_dict()`` (or of the mapping) of Σ its elements, in float64.

    A model is read through ``state_dict()``, so ``weights_fingerprint(model) ==
    weights_fingerprint(model.state_dict())`` and a copy of that dict (e.g. through Ray) gives the same value;
    tied weights appear under both names and count twice on both sides. Each tensor is summed in float64 rows
    of 4096 elements and the row sums are added with ``math.fsum`` (exactly rounded), so the result does not
    depend on the order of the tensors or on torch's thread count: equal weights give bit-equal fingerprints.
    Changing one weight by δ moves the fingerprint by δ (up to float64 rounding, ~1e-16 of the total).
    """
    if isinstance(state_dict_or_model, torch.nn.Module):
        state_dict_or_model = state_dict_or_model.state_dict()
    row_sums: list[float] = []
    with torch.no_grad():
        for tensor in state_dict_or_model.values():
            row_sums.extend(_float64_row_sums(tensor))
    return math.fsum(row_sums)


def _float64_row_sums(tensor: torch.Tensor) -> list[float]:
    flat = tensor.detach().reshape(-1)
    sums: list[float] = []
    for start in range(0, flat.numel(), _ROW * 256):  # bounded float64 copies for large tensors
        chunk = flat[start : start + _ROW * 256].to(device="cpu", dtype=torch.float64)
        padded = torch.nn.functional.pad(chunk, (0, -chunk.numel() % _ROW))  # zeros do not change a sum
        sums.extend(padded.view(-1, _ROW).sum(dim=1).tolist())  # (rows,)
    return sums
