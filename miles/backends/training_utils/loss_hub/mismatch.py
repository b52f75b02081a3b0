"""The mismatch metrics: how far the denominator, and the policy, are from the behavior policy (metrics, not checks;
the guard's checks are ``miles.guard``). The richer group is computed before any mask.

Over a rollout, with d_t = old_t − roll_t per counted token (loss mask 1) and w_t = exp(d_t), the ``off_policy/``
report adds (verl's rollout-correction metrics, here per rollout):

    kl_k1                 mean_t (roll − old)                         k1 estimate of KL(roll ‖ old) (unbiased)
    kl_k3                 mean_t (w − 1 − d)                          k3 estimate (≥ 0, low variance; unclamped)
    chi2_token            mean_t w² − 1                               χ²(old ‖ roll) per token
    chi2_sequence         mean_i exp(clamp(2·Σ_t d_t, ±20)) − 1        χ² of the sequence weight Π_t w_t
    log_ppl_diff          mean_i [mean_t old − mean_t roll]           log-perplexity(roll) − log-perplexity(old)
and, for the built-in TIS choice (``TISChoice``, none under --custom-tis-function-path), what it would drop:
    tis_masked_token_fraction / tis_masked_sequence_fraction   tokens (sequences with any token) left out by the
                                                               mode, the rejection level and the veto together
    vetoed_token_fraction / vetoed_sequence_fraction           tokens with w < --rs-veto-threshold, and the
                                                               sequences holding one
The log ratio is clamped to ±20 before each exponential (as everywhere in the loss), so every value is finite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from miles.backends.training_utils.loss_hub.corrections import builtin_tis_choice
from miles.backends.training_utils.loss_hub.math_utils import (
    LOG_RATIO_CLAMP,
    compute_approx_kl,
    compute_ess_ratio,
    pad_samples,
    valid_positions,
)
from miles.backends.training_utils.loss_hub.tis import TISChoice, tis_weights
from miles.guard.off_policy import denominator_abs_diff


def _mean_over(values: torch.Tensor, keep: torch.Tensor) -> float:
    count = int(keep.sum())
    return float(torch.where(keep, values, torch.zeros_like(values)).sum()) / count if count else 0.0


def divergence_metrics(log_ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """kl_k1, kl_k3, chi2_token, chi2_sequence, log_ppl_diff (module docstring) for d = old − roll ``(B, T)``."""
    keep = mask != 0
    d = torch.where(keep, torch.nan_to_num(log_ratio, nan=0.0), torch.zeros_like(log_ratio)).clamp(
        -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    w = d.exp()
    sequences = keep.any(dim=-1)  # (B,): sequences with a counted token
    row_sum, row_count = d.sum(dim=-1), keep.sum(dim=-1).clamp_min(1).to(d.dtype)
    chi2_sequence = (2 * row_sum).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp() - 1.0
    return {
        "kl_k1": _mean_over(-d, keep),
        "kl_k3": _mean_over(w - 1.0 - d, keep),
        "chi2_token": _mean_over(w.square(), keep) - 1.0 if keep.any() else 0.0,
        "chi2_sequence": _mean_over(chi2_sequence, sequences),
        "log_ppl_diff": _mean_over(row_sum / row_count, sequences),
    }


def rejection_metrics(log_ratio: torch.Tensor, mask: torch.Tensor, choice: TISChoice) -> dict[str, float]:
    """The fractions of tokens and sequences the built-in TIS ``choice`` drops, and those the veto alone hits."""
    keep = mask != 0
    sequences = keep.any(dim=-1)
    result = tis_weights(log_ratio, keep, choice)
    dropped = keep & ~result.keep
    metrics = {"tis_masked_token_fraction": _mean_over(dropped.to(log_ratio.dtype), keep),
               "tis_masked_sequence_fraction": _mean_over(dropped.any(dim=-1).to(log_ratio.dtype), sequences)}
    if choice.veto_threshold is not None:
        catastrophic = keep & (torch.nan_to_num(log_ratio, nan=0.0) < math.log(choice.veto_threshold))
        metrics["vetoed_token_fraction"] = _mean_over(catastrophic.to(log_ratio.dtype), keep)
        metrics["vetoed_sequence_fraction"] = _mean_over(catastrophic.any(dim=-1).to(log_ratio.dtype), sequences)
    return metrics


def mismatch_report(
    old_log_probs: list[torch.Tensor], rollout_log_probs: list[torch.Tensor], loss_masks: list[torch.Tensor],
    choice: TISChoice | None,
) -> dict[str, float]:
    """Both groups above for one rollout's per-sample 1-D tensors (``choice`` None: the divergences only)."""
    valid = valid_positions([o.numel() for o in old_log_probs])
    log_ratio = pad_samples([o.detach() for o in old_log_probs], valid) - pad_samples(rollout_log_probs, valid)
    mask = pad_samples([m.to(log_ratio.dtype) for m in loss_masks], valid) != 0
    report = divergence_metrics(log_ratio, mask)
    if choice is not None:
        report.update(rejection_metrics(log_ratio, mask, choice))
    return report


def behavior_weight_report(
    old_log_probs: list[torch.Tensor], rollout_log_probs: list[torch.Tensor], tis_clip: float, tis_clip_low: float
) -> dict[str, float]:
    """The importance weights between the denominator and the behavior policy, as metrics (no check reads them).

    kl = low_var_kl k3 estimate of KL(roll ‖ old); raw TIS weight w = exp(old − roll) (min, mean, max, std:
    E_roll[w] = 1 per token), tis_abs = mean |w − 1|, the weights as --use-tis applies them,
    clamp(w, tis_clip_low, tis_clip) (min, max), the fraction of w outside those bounds, and the per-sample ESS ratio
    (Σw)²/(n·Σw²), averaged.
    """
    old, roll = torch.cat(old_log_probs), torch.cat(rollout_log_probs)  # (N_tokens,)
    # The log-ratio is clamped to ±20 as in the PPO ratio and the loss's TIS (tis.py), so the report stays finite.
    weights = (old - roll).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    applied = weights.clamp(tis_clip_low, tis_clip)
    valid = valid_positions([o.numel() for o in old_log_probs])  # (B, T_max): one padded pass, not one per sample
    ess = compute_ess_ratio(pad_samples(old_log_probs, valid) - pad_samples(rollout_log_probs, valid), valid)  # (B,)
    return {
        "denominator_behavior_kl": float(compute_approx_kl(roll, old, "low_var_kl").mean()),
        "tis_raw_min": float(weights.min()),
        "tis_raw_mean": float(weights.mean()),
        "tis_raw_max": float(weights.max()),
        "tis_raw_std": float(weights.std()) if weights.numel() > 1 else 0.0,
        "tis_abs": float((weights - 1).abs().mean()),
        "tis_applied_min": float(applied.min()),
        "tis_applied_max": float(applied.max()),
        "tis_clip_fraction": float(((weights > tis_clip) | (weights < tis_clip_low)).float().mean()),
        "ess": float(ess.mean()),
        "num_tokens": float(weights.numel()),
    }


def denominator_vs_behavior(
    old_log_probs: list[torch.Tensor], rollout_log_probs: list[torch.Tensor], tis_clip: float, tis_clip_low: float
) -> dict[str, float]:
    """How far the denominator is from the behavior policy: the guard's comparison and the weights' report."""
    return {**denominator_abs_diff(old_log_probs, rollout_log_probs),
            **behavior_weight_report(old_log_probs, rollout_log_probs, tis_clip, tis_clip_low)}


def policy_vs_behavior(log_probs: list[torch.Tensor], rollout_log_probs: list[torch.Tensor]) -> dict[str, float]:
    """How far the current policy (at the first optimizer step) has drifted from the behavior policy.

    abs_diff = mean |lp − roll|; kl = low_var_kl k3 estimate of KL(roll ‖ π_θ), over all response tokens.
    """
    current, roll = torch.cat([lp.detach() for lp in log_probs]), torch.cat(rollout_log_probs)
    return {
        "policy_behavior_abs_diff": float((current - roll).abs().mean()),
        "policy_behavior_kl": float(compute_approx_kl(roll, current, "low_var_kl").mean()),
    }


@dataclass(frozen=True)
class MismatchConfig:
    """What the per-rollout mismatch report needs: --tis-clip / --tis-clip-low (the weights as --use-tis would apply
    them) and the built-in TIS choice whose drops it counts (None under a --custom-tis-function-path hook)."""

    tis_clip: float
    tis_clip_low: float
    choice: TISChoice | None

    @classmethod
    def from_args(cls, args) -> MismatchConfig:
        return cls(args.tis_clip, args.tis_clip_low, builtin_tis_choice(args))


def rollout_report(config: MismatchConfig, old_log_probs: list[torch.Tensor], rollout_log_probs: list[torch.Tensor],
                   loss_masks: list[torch.Tensor]) -> dict[str, float]:
    """A rollout's mismatch metrics (no check reads them): the importance weights, then the richer group."""
    return {**behavior_weight_report(old_log_probs, rollout_log_probs, config.tis_clip, config.tis_clip_low),
            **mismatch_report(old_log_probs, rollout_log_probs, loss_masks, config.choice)}
