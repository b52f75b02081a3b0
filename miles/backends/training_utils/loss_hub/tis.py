"""Pure math of the importance-sampling family, the TIS row's (docs/corrections.md has each formula with a worked
example); its hook-signature entry points are in ``corrections.py``, its per-rollout metrics in ``mismatch.py``.

Tensors and scalars in, tensors out: no ``args``. Inputs are padded ``(B, T)`` tensors with a 0/1 or bool ``mask``
(True at the tokens that count); masked positions never reach a result. Everything here is a constant of the loss
(computed without grad).

Per token t of sequence i, with the log ratio d_t = old_t − roll_t (log π_old/π_rollout):

    level      token:      ℓ_t = d_t
               sequence:   ℓ_t = Σ_s m_s·d_s                      (the same for every token of the sequence)
               geometric:  ℓ_t = Σ_s m_s·d_s / max(Σ_s m_s, 1)     (log of the geometric mean of the token ratios)
    ratio      r_t = exp(clamp(ℓ_t, −20, 20))
    mode       truncate:   w = min(r, high),              keep = 1
               clip:       w = clamp(r, low, high),       keep = 1
               mask:       keep = 1[low ≤ r ≤ high],      w = r·keep      (IcePop at the token level)
    rejection  (rs_level set)  keep ∧= 1[rs_low ≤ r^rs ≤ rs_high],  r^rs the ratio at rs_level
    veto       (threshold τ)   keep ∧= 1[no token s of the sequence has exp(d_s) < τ]

Sources: TIS (https://fengyao.notion.site/off-policy-rl), IcePop (https://arxiv.org/abs/2510.18855), MIS and the veto
(upstream miles ``examples/train_infer_mismatch_helper/mis.py``), geometric masking (SkyRL).

Departures from upstream: the veto acts whether or not a rejection level is set (upstream's MIS applies it only
inside its rejection branch); the ratios here clamp the log ratio to ±20 (MIS's safety bound) also at the token
level, where upstream's vanilla TIS does not (an infinite weight is truncated to ``high`` anyway).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from miles.backends.training_utils.loss_hub.math_utils import LOG_RATIO_CLAMP


def _masked_row_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ_t m_t·values_t per row, ``(B, 1)``; masked values (even NaN) never enter the sum."""
    keep = mask != 0
    return torch.where(keep, values, torch.zeros((), dtype=values.dtype)).sum(dim=-1, keepdim=True)


def _token_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return log_ratio


def _sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ℓ = Σ m·d per sequence, broadcast to its tokens: the log of the product of the token ratios."""
    return _masked_row_sum(log_ratio, mask).expand_as(log_ratio)


def _geometric_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ℓ = Σ m·d / max(Σ m, 1) per sequence, broadcast: the log of the geometric mean of the token ratios."""
    count = (mask != 0).sum(dim=-1, keepdim=True).clamp_min(1).to(log_ratio.dtype)
    return (_masked_row_sum(log_ratio, mask) / count).expand_as(log_ratio)


LEVEL_LOG_RATIOS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token": _token_log_ratio,
    "sequence": _sequence_log_ratio,
    "geometric": _geometric_log_ratio,
}


def _choose(table: dict, name: str, what: str):
    if name not in table:
        raise ValueError(f"{what} is {name!r}, but it must be one of {', '.join(table)}.")
    return table[name]


def level_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """r = exp(clamp(ℓ, −20, 20)), ℓ the ``level``'s aggregate of the log ratio (module docstring), ``(B, T)``."""
    with torch.no_grad():
        aggregate = _choose(LEVEL_LOG_RATIOS, level, "the TIS level")(torch.nan_to_num(log_ratio, nan=0.0), mask)
        return aggregate.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()


def _truncate(ratio: torch.Tensor, low: float, high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """w = min(r, high); every token kept (``low`` is not used: truncation has one side)."""
    return ratio.clamp(max=high), torch.ones_like(ratio, dtype=torch.bool)


def _clip(ratio: torch.Tensor, low: float, high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """w = clamp(r, low, high); every token kept (upstream's vanilla TIS; with low = 0 it is truncation)."""
    return ratio.clamp(low, high), torch.ones_like(ratio, dtype=torch.bool)


def _mask(ratio: torch.Tensor, low: float, high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """keep = 1[low ≤ r ≤ high], w = r·keep (IcePop: a token outside the band leaves the loss)."""
    keep = (ratio >= low) & (ratio <= high)
    return torch.where(keep, ratio, torch.zeros_like(ratio)), keep


BOUND_MODES: dict[str, Callable[[torch.Tensor, float, float], tuple[torch.Tensor, torch.Tensor]]] = {
    "truncate": _truncate,
    "clip": _clip,
    "mask": _mask,
}


def bounded_weights(ratio: torch.Tensor, mode: str, low: float, high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w, keep)`` of the ``mode`` (module docstring) for ratios ``r`` of any shape."""
    with torch.no_grad():
        return _choose(BOUND_MODES, mode, "the TIS mode")(ratio, low, high)


def veto_keep(log_ratio: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """``(B, T)`` bool: False on every token of a sequence holding a counted token with exp(d) < ``threshold``."""
    with torch.no_grad():
        catastrophic = (mask != 0) & (torch.nan_to_num(log_ratio, nan=0.0) < math.log(threshold))
        return (~catastrophic.any(dim=-1, keepdim=True)).expand_as(log_ratio)


@dataclass(frozen=True)
class TISChoice:
    """The scalars of the built-in TIS (flags --tis-mode, --tis-level, --tis-clip-low, --tis-clip, --rs-level,
    --rs-lower-bound, --rs-upper-bound, --rs-veto-threshold)."""

    mode: str = "clip"
    level: str = "token"
    low: float = 0.0
    high: float = 2.0
    rs_level: str | None = None
    rs_low: float | None = None  # None: ``low``
    rs_high: float | None = None  # None: ``high``
    veto_threshold: float | None = None


@dataclass(frozen=True)
class TISResult:
    """What ``tis_weights`` decided, ``(B, T)`` each, with the masks of every stage for the metrics."""

    weights: torch.Tensor  # w: multiplies the per-token policy loss
    keep: torch.Tensor  # bool: the tokens left in the loss (mode ∧ rejection ∧ veto), within ``mask``
    ratio: torch.Tensor  # r at the TIS level, before the bound
    mode_keep: torch.Tensor  # bool: kept by the mode (all True unless mode = mask)
    rejection_keep: torch.Tensor  # bool: kept by the rejection level (all True when none)
    veto_keep: torch.Tensor  # bool: kept by the veto (all True when none)


def tis_weights(log_ratio: torch.Tensor, mask: torch.Tensor, choice: TISChoice) -> TISResult:
    """The built-in TIS of ``choice`` for log ratios d = old − roll ``(B, T)`` (module docstring, in that order)."""
    with torch.no_grad():
        counted = mask != 0
        ratio = level_ratio(log_ratio, counted, choice.level)
        weights, mode_keep = bounded_weights(ratio, choice.mode, choice.low, choice.high)
        everything = torch.ones_like(counted)
        rejection = everything
        if choice.rs_level is not None:
            rs_ratio = ratio if choice.rs_level == choice.level else level_ratio(log_ratio, counted, choice.rs_level)
            rs_low = choice.low if choice.rs_low is None else choice.rs_low
            rs_high = choice.high if choice.rs_high is None else choice.rs_high
            _, rejection = bounded_weights(rs_ratio, "mask", rs_low, rs_high)
        veto = everything if choice.veto_threshold is None else veto_keep(log_ratio, counted, choice.veto_threshold)
        keep = counted & mode_keep & rejection & veto
        weights = torch.where(keep, weights, torch.zeros_like(weights))
        return TISResult(weights, keep, ratio, mode_keep, rejection, veto)
