"""Pure tensor math of the policy, value and advantage losses (docs/design.md §3, §7).

Tensors and scalars in, tensors out: no ``args``, no global state. Per-token functions take any shape and treat
the last dimension as the token dimension, so they work on one sample's response (``(T,)``) and on a padded
micro-batch (``(B, T)``, padding masked out) alike. Masks are 0/1 (any dtype); a position with mask 0 is
excluded, and its value, even NaN or ±inf, never reaches a result.

Sources: PPO (https://arxiv.org/abs/1707.06347), dual clip (https://arxiv.org/abs/1912.09729), KL estimators
(http://joschu.net/blog/kl-approx.html), GAE (https://arxiv.org/abs/1506.02438), REINFORCE++
(https://arxiv.org/abs/2501.03262), GSPO (https://arxiv.org/abs/2507.18071), upstream miles ``ppo_utils.py``.

Departures from upstream miles semantics:
- ``compute_policy_loss`` maps a NaN log-ratio to 0 and clamps it to ±20 before the exponential, so a
  non-finite log-ratio cannot poison the loss (upstream sanitizes in the caller, mapping ±inf to 0 as well).
- ``compute_approx_kl`` ``low_var_kl`` clamps the log-ratio to ±20 (verl's form) and maps NaN to 0 before
  the result clamp; k1, k2 and k3 are upstream's unclamped estimators.
- ``get_advantages_and_returns`` takes an optional mask and runs GAE over the mask = 1 positions only, as if
  the others were absent (upstream runs over every response token); masked positions get 0.
- ``normalize_advantages`` writes 0 at masked positions (upstream whitens them too; they never reach a loss).
- ``compute_ess_ratio`` shifts log-weights by their per-sample maximum before the exponential (the ratio is
  scale invariant), so log-ratios of ±50 or ±inf give a finite value.
- ``sum_of_sample_mean`` / ``sum_of_token`` take an optional ``divisor`` (default: the mean over samples or
  tokens); the loss glue passes the optimizer step's divisor (upstream divides by the global batch later).
"""

from __future__ import annotations

import torch

LOG_RATIO_CLAMP = 20.0  # exp(20) ≈ 4.9e8: far past any clip range, far below float32 overflow (exp(88))
LOW_VAR_KL_CLAMP = 10.0
WHITEN_EPS = 1e-8
KL_LOSS_TYPES = ("k1", "k2", "k3", "low_var_kl")


def safe_log_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """clamp(nan_to_num(log_ratio, nan=0), −20, 20): a log-ratio whose exponential is always finite.

    NaN becomes 0 (ratio 1) and ±inf becomes ±20; the gradient is 0 wherever the clamp or the NaN map acts.
    """
    return torch.nan_to_num(log_ratio, nan=0.0).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def compute_policy_loss(
    ppo_kl: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped PPO surrogate loss and clip indicator.

    With ppo_kl = old_log_probs − log_probs (any shape, e.g. ``(B, T)``) and A = advantages (same shape):
        ratio = exp(clamp(−ppo_kl, −20, 20))            (NaN log-ratio → 0, see ``safe_log_ratio``)
        pg    = max(−ratio·A, −clamp(ratio, 1 − eps_clip, 1 + eps_clip_high)·A)
        clipfrac = 1[−clamp(ratio, …)·A > −ratio·A]      (taken before the dual clip)
        dual clip (eps_clip_c = c > 1): where A < 0, pg = min(pg, −c·A)
    A zero advantage gives a loss of exactly 0 whatever the log-ratio (NaN and ±inf included).
    Returns ``(pg_losses, clipfrac)``, both shaped like ``ppo_kl``; clipfrac is a float 0/1 tensor.
    """
    if eps_clip_c is not None and eps_clip_c <= 1.0:
        raise ValueError(
            f"eps_clip_c is {eps_clip_c}, but the dual-clip constant must be > 1 (it caps −ratio·A at −c·A for "
            "negative advantages). Pass e.g. 3.0, or None to turn the dual clip off."
        )
    ratio = safe_log_ratio(-ppo_kl).exp()
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high) * advantages
    pg_losses = torch.maximum(unclipped, clipped)
    clipfrac = torch.gt(clipped, unclipped).to(pg_losses.dtype)
    if eps_clip_c is not None:
        dual_clipped = torch.minimum(pg_losses, -eps_clip_c * advantages)
        pg_losses = torch.where(advantages < 0, dual_clipped, pg_losses)
    return pg_losses, clipfrac


def compute_approx_kl(
    log_probs: torch.Tensor,
    log_probs_base: torch.Tensor,
    kl_loss_type: str,
    importance_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_base) from samples of π, with r = log_probs − log_probs_base.

        k1 = r;   k2 = r²/2;   k3 = exp(−r) − 1 + r
        low_var_kl = clamp(k3 with r clamped to ±20 (NaN → 0), −10, 10)   (finite for any input)
    ``importance_ratio`` (optional, same shape) multiplies the estimate before the low_var_kl clamp
    (upstream's unbiased KL, π_θ/π_old). Raises ``ValueError`` for an unknown ``kl_loss_type``.
    """
    if kl_loss_type not in KL_LOSS_TYPES:
        raise ValueError(f"kl_loss_type is {kl_loss_type!r}, but it must be one of {', '.join(KL_LOSS_TYPES)}.")
    log_ratio = log_probs - log_probs_base
    if kl_loss_type == "low_var_kl":
        log_ratio = safe_log_ratio(log_ratio)
    if kl_loss_type == "k1":
        kl = log_ratio
    elif kl_loss_type == "k2":
        kl = log_ratio.square() / 2.0
    else:  # k3 and low_var_kl: non-negative, unbiased, low variance
        kl = (-log_ratio).exp() - 1.0 + log_ratio
    if importance_ratio is not None:
        kl = importance_ratio * kl
    if kl_loss_type == "low_var_kl":
        kl = torch.nan_to_num(kl, nan=0.0).clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)
    return kl


def compute_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, value_clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped value loss.

        v_clip   = v_old + clamp(v − v_old, −value_clip, value_clip)
        loss     = max((v_clip − R)², (v − R)²)
        clipfrac = 1[|v − v_old| > value_clip]
    Returns ``(losses, clipfrac)``, shaped like ``values``; clipfrac is a float 0/1 tensor.
    """
    values_clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
    losses = torch.maximum((values_clipped - returns).square(), (values - returns).square())
    clipfrac = torch.gt((values - old_values).abs(), value_clip).to(losses.dtype)
    return losses, clipfrac


def get_advantages_and_returns(
    values: torch.Tensor,
    rewards: torch.Tensor,
    gamma: float,
    lambd: float,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over one sample's response tokens (1-D, ``(T,)``).

    Value alignment: ``values[t]`` is the critic's value at the position that predicts response token t (the
    position whose logits give the token's log-prob), and ``rewards[t]`` is the reward received for token t.
    Over the kept positions t_1 < … < t_n (all of them, or those with mask = 1, as if the others were absent):
        δ_k = r_k + γ·V_{k+1} − V_k,   V_{n+1} = 0 (also for a truncated response)
        A_k = δ_k + γλ·A_{k+1},        A_{n+1} = 0
        R_k = A_k + V_k
    Masked positions get A = R = 0. Returns ``(advantages, returns)``, ``(T,)`` each, without grad.
    """
    if values.dim() != 1 or values.shape != rewards.shape:
        raise ValueError(
            f"values {tuple(values.shape)} and rewards {tuple(rewards.shape)} must be the same 1-D shape: one "
            "entry per response token of one sample."
        )
    keep = torch.ones_like(values, dtype=torch.bool) if mask is None else mask != 0
    advantages, returns = masked_gae(values.unsqueeze(0), rewards.unsqueeze(0), keep.unsqueeze(0), gamma, lambd)
    return advantages[0], returns[0]


def masked_gae(
    values: torch.Tensor, rewards: torch.Tensor, keep: torch.Tensor, gamma: float, lambd: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``get_advantages_and_returns`` for a whole padded rollout: ``values``, ``rewards``, ``keep`` are ``(B, T)``;
    each row is one sample, and its positions with keep = False (masked tokens, padding) are skipped as if absent.

    One reverse pass over T, vectorized over the rows, in float64 (the recursion's rounding stays far below
    float32's): at a kept position t, δ_t = r_t + γ·V_next − V_t and A_t = δ_t + γλ·A_next, then (V_next, A_next)
    = (V_t, A_t); at a skipped one, A_t = 0 and (V_next, A_next) pass through. Returns ``(advantages, returns)``,
    ``(B, T)`` in the values' dtype, 0 where keep is False, without grad.
    """
    kept_values, kept_rewards = values.detach().double(), rewards.detach().double()
    advantages = torch.zeros_like(kept_values)
    next_value = next_advantage = torch.zeros(values.shape[0], dtype=torch.float64, device=values.device)
    for t in reversed(range(values.shape[1])):
        advantage = kept_rewards[:, t] + gamma * next_value - kept_values[:, t] + gamma * lambd * next_advantage
        kept = keep[:, t]
        advantages[:, t] = torch.where(kept, advantage, 0.0)
        next_advantage = torch.where(kept, advantage, next_advantage)
        next_value = torch.where(kept, kept_values[:, t], next_value)
    returns = torch.where(keep, advantages + kept_values, 0.0)
    return advantages.to(values.dtype), returns.to(values.dtype)


def get_reinforce_plus_plus_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted returns over one response (1-D, ``(T,)``): G_t = r_t + γ·G_{t+1}, G_T = 0. No grad."""
    token_rewards = rewards.detach().tolist()
    returns = [0.0] * len(token_rewards)
    running = 0.0
    for t in reversed(range(len(token_rewards))):
        running = token_rewards[t] + gamma * running
        returns[t] = running
    return torch.tensor(returns, dtype=rewards.dtype, device=rewards.device)


def group_normalize_rewards(
    rewards: torch.Tensor, group_size: int, std_normalization: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO's group-relative reward, for rewards ``(N,)`` in contiguous groups of ``group_size``.

        Â_i = r_i − mean_g                          (std_normalization off, or a group of one)
        Â_i = (r_i − mean_g) / (std_g + eps)        std_g Bessel-corrected (torch's default)
    A group whose rewards are all equal gets 0. Returns ``(N,)``.
    """
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"{rewards.numel()} rewards cannot be split into groups of {group_size}: the number of rewards must "
            "be a positive multiple of the group size (--n-samples-per-prompt)."
        )
    grouped = rewards.reshape(-1, group_size)  # (num_groups, group_size)
    centered = grouped - grouped.mean(dim=-1, keepdim=True)
    if std_normalization and group_size > 1:
        centered = centered / (grouped.std(dim=-1, keepdim=True) + eps)
    return centered.reshape(rewards.shape)


def normalize_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked whitening of advantages (any shape, typically all tokens of a rollout concatenated).

    Over the n positions with mask = 1:
        μ = Σ A / n,   σ² = Σ (A − μ)² / (n − 1)   (n ≥ 2; σ² = 0 for n = 1, upstream's Bessel rule)
        Â = (A − μ) · rsqrt(σ² + 1e-8)   at mask = 1,   0 elsewhere.
    Raises ``ValueError`` when no position has mask = 1.
    """
    keep = mask != 0
    count = int(keep.sum())
    if count == 0:
        raise ValueError("normalize_advantages got a mask with no unmasked token; there is nothing to whiten.")
    kept = advantages[keep]
    mean = kept.mean()
    variance = kept.var(correction=1) if count >= 2 else torch.zeros_like(mean)
    whitened = (advantages - mean) * torch.rsqrt(variance + WHITEN_EPS)
    return torch.where(keep, whitened, torch.zeros_like(whitened))


def _row_sum_and_count(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked sum and mask count over the last (token) dimension; masked values never enter the sum."""
    keep = mask != 0
    row_sum = torch.where(keep, values, torch.zeros_like(values)).sum(dim=-1)
    return row_sum, keep.sum(dim=-1).to(values.dtype)


def compute_gspo_kl(ppo_kl: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's sequence-level log-ratio, broadcast back to the tokens.

    For each sequence (last dimension): s = Σ_t m_t·ppo_kl_t / max(Σ_t m_t, 1); every token gets s (a fully
    masked sequence gets 0). Gradients flow to every unmasked token of the sequence. Returns ``ppo_kl``'s shape.
    """
    row_sum, count = _row_sum_and_count(ppo_kl, mask)
    sequence_kl = row_sum / count.clamp_min(1.0)
    return sequence_kl.unsqueeze(-1).expand_as(ppo_kl)


def compute_ess_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Effective-sample-size ratio of per-token importance weights, per sequence (last dimension).

        w_t = exp(log_ratio_t) for the n tokens with mask = 1;   ESS = (Σ w)² / (n · Σ w²)  ∈ [1/n, 1]
    Masked tokens are removed before the exponential, and log-weights are shifted by their maximum (ESS is
    scale invariant), so ±inf or ±50 give a finite value. A fully masked sequence gives 0. No grad.
    Returns ``log_ratio.shape[:-1]``.
    """
    with torch.no_grad():
        keep = mask != 0
        finfo = torch.finfo(log_ratio.dtype)
        finite = torch.nan_to_num(log_ratio, nan=float("nan"), posinf=finfo.max, neginf=finfo.min)
        shifted = torch.where(keep, finite, torch.full_like(finite, float("-inf")))
        row_max = shifted.amax(dim=-1, keepdim=True).clamp_min(finfo.min)  # -inf only for fully masked rows
        weights = (shifted - row_max).exp()  # max weight 1; masked tokens exp(-inf) = 0
        count = keep.sum(dim=-1).to(log_ratio.dtype)
        ess = weights.sum(dim=-1).square() / (count * weights.square().sum(dim=-1)).clamp_min(finfo.tiny)
        return torch.where(count > 0, ess, torch.zeros_like(ess))


def valid_positions(lengths: list[int] | tuple[int, ...]) -> torch.Tensor:
    """``(B, T_max)`` bool: True at the first ``lengths[i]`` positions of row i (the padded layout's real tokens)."""
    lengths_b = torch.tensor(list(lengths), dtype=torch.long)  # (B,)
    return torch.arange(max(lengths, default=0)) < lengths_b.unsqueeze(-1)


def pad_samples(per_sample: list[torch.Tensor], valid: torch.Tensor) -> torch.Tensor:
    """Per-sample 1-D tensors → ``(B, T_max)``, 0 at padding (``valid`` from ``valid_positions``).

    One ``cat`` and one differentiable ``masked_scatter``: far cheaper than ``pad_sequence`` for many short
    samples, whose backward makes one copy node per sample.
    """
    flat = torch.cat(list(per_sample))  # (Σ T_i,)
    return flat.new_zeros(valid.shape).masked_scatter(valid, flat)


def _as_padded(
    values: list[torch.Tensor] | torch.Tensor, masks: list[torch.Tensor] | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lists of per-sample 1-D tensors → ``(B, T)`` tensors padded with mask 0; a tensor passes through."""
    if isinstance(values, torch.Tensor):
        return values, masks
    if len(values) != len(masks) or any(v.shape != m.shape or v.dim() != 1 for v, m in zip(values, masks)):
        raise ValueError(
            f"values and masks must pair up sample by sample as 1-D tensors of equal length; got shapes "
            f"{[tuple(v.shape) for v in values]} and {[tuple(m.shape) for m in masks]}."
        )
    valid = valid_positions([v.numel() for v in values])
    return pad_samples(values, valid), pad_samples(masks, valid)


def sum_of_sample_mean(
    values: list[torch.Tensor] | torch.Tensor,
    masks: list[torch.Tensor] | torch.Tensor,
    divisor: float | None = None,
) -> torch.Tensor:
    """The sample-mean reduction every loss uses.

        Σ_i ( Σ_t m_it·v_it / max(Σ_t m_it, 1) ) / divisor,   divisor = number of samples by default
    i.e. each sample's masked token mean, then the mean over samples; a fully masked sample contributes 0.
    ``values``/``masks``: lists of per-sample 1-D tensors, or padded ``(B, T)`` tensors. Returns a scalar.
    The loss glue passes the optimizer step's sample count as ``divisor`` so micro-batch losses add up.
    """
    values_bt, masks_bt = _as_padded(values, masks)
    row_sum, count = _row_sum_and_count(values_bt, masks_bt)
    total = (row_sum / count.clamp_min(1.0)).sum()
    return total / (values_bt.shape[0] if divisor is None else divisor)


def sum_of_token(
    values: list[torch.Tensor] | torch.Tensor,
    masks: list[torch.Tensor] | torch.Tensor,
    divisor: float | None = None,
) -> torch.Tensor:
    """The token-sum reduction of ``--calculate-per-token-loss``.

        Σ_i Σ_t m_it·v_it / divisor,   divisor = max(number of unmasked tokens, 1) by default (a token mean)
    Same inputs as ``sum_of_sample_mean``. Returns a scalar.
    """
    values_bt, masks_bt = _as_padded(values, masks)
    row_sum, count = _row_sum_and_count(values_bt, masks_bt)
    return row_sum.sum() / (max(float(count.sum()), 1.0) if divisor is None else divisor)
