"""Pure tensor math of the policy, value and advantage losses (docs/design.md §3, §7), at upstream's path and names.

Tensors and scalars in, tensors out: no ``args``, no global state (the GAE reads the context-parallel layout through
``cp_utils``, as upstream's does). Per-token functions take any shape and treat the last dimension as the token
dimension, so they work on one sample's response (``(T,)``) and on a padded micro-batch (``(B, T)``, padding masked
out) alike. Masks are 0/1 (any dtype); a position with mask 0 is excluded, and its value, even NaN or ±inf, never
reaches a result.

Sources: PPO (https://arxiv.org/abs/1707.06347), dual clip (https://arxiv.org/abs/1912.09729), KL estimators
(http://joschu.net/blog/kl-approx.html), GAE (https://arxiv.org/abs/1506.02438), REINFORCE++
(https://arxiv.org/abs/2501.03262), GSPO (https://arxiv.org/abs/2507.18071), upstream miles
``miles/backends/training_utils/loss_hub/math_utils.py``.

Upstream wraps ``compute_policy_loss`` and ``compute_approx_kl`` in ``torch.compile`` and its tests call them
eagerly through ``.__wrapped__``; miles runs them eagerly (``_eager`` keeps ``.__wrapped__``, so both calls work).

Departures from upstream's results (rows in ``miles/config/departures.toml``, each with a test of both):
- ``get_reinforce_plus_plus_returns`` discounts over the trainable tokens only, as if the masked ones were absent
  (as upstream's GAE does; upstream's REINFORCE++ discounts across masked tokens), and gives zeros to a fully
  masked sample (upstream asserts).
- ``normalize_advantages`` writes 0 at masked positions (upstream whitens them too; they never reach a loss).
- ``compute_ess_ratio`` shifts log-weights by their per-sample maximum before the exponential (the ratio is
  scale invariant) where upstream clamps them to ±20.
Differences that change no result beyond float32 rounding: the GAE (``vanilla_gae``, ``chunked_gae``) runs in
float64 and rounds once to the input's dtype; ``sum_of_sample_mean`` / ``sum_of_token`` take an optional
``divisor`` (the loss glue passes the optimizer step's; upstream divides by the global batch later).
"""

from __future__ import annotations

import functools

import torch

from miles.backends.training_utils.cp_utils import all_gather_with_cp, slice_log_prob_with_cp

LOG_RATIO_CLAMP = 20.0  # exp(20) ≈ 4.9e8: far past any clip range, far below float32 overflow (exp(88))
LOW_VAR_KL_CLAMP = 10.0
WHITEN_EPS = 1e-8
KL_LOSS_TYPES = ("k1", "k2", "k3", "low_var_kl")


def _eager(function):
    """``function`` as is, with ``.__wrapped__`` naming it: where upstream has ``torch.compile`` (whose result keeps
    the eager function as ``.__wrapped__``), miles calls eagerly, so upstream's callers of either form work."""

    @functools.wraps(function)
    def call(*args, **kwargs):
        return function(*args, **kwargs)

    return call


def safe_log_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """clamp(nan_to_num(log_ratio, nan=0), −20, 20): a log-ratio whose exponential is always finite.

    NaN becomes 0 (ratio 1) and ±inf becomes ±20; the gradient is 0 wherever the clamp or the NaN map acts.
    """
    return torch.nan_to_num(log_ratio, nan=0.0).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


@_eager
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


@_eager
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


def _check_rows(rewards: torch.Tensor, values: torch.Tensor) -> None:
    if rewards.dim() != 2 or rewards.shape != values.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and values {tuple(values.shape)} must be the same (B, T) shape: one row "
            "per sample, one column per position."
        )


def _deltas(rewards: torch.Tensor, values: torch.Tensor, gamma: float) -> torch.Tensor:
    """δ_t = r_t + γ·V_{t+1} − V_t per row, V_T = 0, in float64."""
    values64 = values.detach().double()
    next_values = torch.nn.functional.pad(values64[:, 1:], (0, 1))
    return rewards.detach().double() + gamma * next_values - values64


def vanilla_gae(
    rewards: torch.Tensor, values: torch.Tensor, gamma: float, lambd: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over every position of each row of ``(B, T)`` rewards and values: one reverse pass over T.

        δ_t = r_t + γ·V_{t+1} − V_t,   V_T = 0 (no bootstrap past the row)
        A_t = δ_t + γλ·A_{t+1},        A_T = 0
        R_t = A_t + V_t
    The recursion runs in float64 (its rounding stays far below float32's) and the results are rounded once to the
    rewards' dtype. Returns ``(advantages, returns)``, ``(B, T)`` each, without grad.
    """
    _check_rows(rewards, values)
    deltas = _deltas(rewards, values, gamma)
    advantages = torch.empty_like(deltas)
    carry = deltas.new_zeros(deltas.shape[0])
    for t in reversed(range(deltas.shape[1])):
        carry = deltas[:, t] + gamma * lambd * carry
        advantages[:, t] = carry
    returns = advantages + values.detach().double()
    return advantages.to(rewards.dtype), returns.to(rewards.dtype)


def chunked_gae(
    rewards: torch.Tensor, values: torch.Tensor, gamma: float, lambd: float, chunk_size: int = 128
) -> tuple[torch.Tensor, torch.Tensor]:
    """``vanilla_gae``'s result in T / chunk_size sequential steps instead of T (upstream's chunked scan).

    Read backwards, GAE is the scan S_k = Δ_k + w·S_{k−1} of the reversed deltas Δ, w = γλ. Cut Δ into chunks of
    C = chunk_size positions (the last one zero-padded, after the real positions, so it changes none of them):
        inside a chunk, from a zero state:   L = Δ_chunk @ M,   M[i, j] = w^(j−i) for j ≥ i, 0 below;
        across chunks, the end states:       s_c = L_c[C−1] + w^C·s_{c−1},   s_{−1} = 0;
        every position k of chunk c:         S = L_c[k] + w^(k+1)·s_{c−1}.
    float64 throughout, like ``vanilla_gae``, so the two agree to float64 rounding before the final cast.
    """
    _check_rows(rewards, values)
    if chunk_size < 1:
        raise ValueError(f"chunk_size is {chunk_size}, but a chunk needs at least one position.")
    batch, length = rewards.shape
    w = gamma * lambd
    reversed_deltas = torch.flip(_deltas(rewards, values, gamma), dims=[1])
    num_chunks = -(-length // chunk_size)
    chunks = torch.nn.functional.pad(reversed_deltas, (0, num_chunks * chunk_size - length))
    chunks = chunks.view(batch, num_chunks, chunk_size)
    offsets = torch.arange(chunk_size, dtype=torch.float64)
    exponents = offsets.unsqueeze(0) - offsets.unsqueeze(1)  # (C, C): j − i
    scan = torch.where(exponents >= 0, torch.pow(w, exponents.clamp_min(0)), 0.0)  # w^0 = 1, also for w = 0
    local = chunks @ scan  # (B, n, C)
    ends = local[:, :, -1]
    states = local.new_zeros(batch, num_chunks)  # states[:, c] = s_{c−1}, the state entering chunk c
    for c in range(1, num_chunks):
        states[:, c] = ends[:, c - 1] + w**chunk_size * states[:, c - 1]
    scanned = local + states.unsqueeze(-1) * torch.pow(w, offsets + 1)
    advantages = torch.flip(scanned.reshape(batch, -1)[:, :length], dims=[1])
    returns = advantages + values.detach().double()
    return advantages.to(rewards.dtype), returns.to(rewards.dtype)


def get_advantages_and_returns_batch(
    total_lengths: list[int],
    response_lengths: list[int],
    values_list: list[torch.Tensor],
    rewards_list: list[torch.Tensor],
    terminal_rewards: list[float],
    qkv_format: str,
    max_seq_lens: list[int] | None,
    loss_masks: list[torch.Tensor],
    gamma: float,
    lambd: float,
    chunked: bool = True,
    bootstrap_values: list[float] | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """GAE for a batch of samples over their trainable (loss mask ≠ 0) tokens only (upstream's semantics).

    Sample i has token rewards ``rewards_list[i]`` and critic values ``values_list[i]`` over its
    ``response_lengths[i]`` response tokens (``total_lengths[i]`` = prompt + response; ``qkv_format`` and
    ``max_seq_lens`` place the tensors in the context-parallel layout, ``cp_utils``). Its trainable positions
    t_1 < … < t_K form the MDP, as if the masked ones were absent:
        r'_k = r_{t_k} (+ terminal_rewards[i] + γ·b_i at k = K),   b_i = bootstrap_values[i] (default 0: a truncated
        response bootstraps like a finished one)
        GAE of ``vanilla_gae`` (``chunked_gae`` when ``chunked``) over (r', V_{t_1..t_K})
    Masked positions get A = R = 0; a fully masked sample gets zeros (its terminal reward is dropped).
    Returns ``(advantages_list, returns_list)``, one 1-D tensor per sample in the values' dtype, without grad.
    """
    count = len(response_lengths)
    inputs = (total_lengths, values_list, rewards_list, terminal_rewards, loss_masks)
    if any(len(each) != count for each in inputs) or (bootstrap_values is not None and len(bootstrap_values) != count):
        raise ValueError(f"every per-sample list must have {count} entries (one per response length).")
    if count == 0:
        return [], []
    max_lens = max_seq_lens if max_seq_lens is not None else [None] * count
    with torch.no_grad():
        values = [all_gather_with_cp(v, *lens, qkv_format, m)
                  for v, *lens, m in zip(values_list, total_lengths, response_lengths, max_lens, strict=True)]
        rewards = [all_gather_with_cp(r, *lens, qkv_format, m)
                   for r, *lens, m in zip(rewards_list, total_lengths, response_lengths, max_lens, strict=True)]
        keep = [mask[:length] != 0 for mask, length in zip(loss_masks, response_lengths, strict=True)]
        kept_lengths = [int(k.sum()) for k in keep]
        packed = valid_positions(kept_lengths)  # (B, K_max): True at each sample's first K_i packed columns
        dtype = values_list[0].dtype
        packed_values = pad_samples([v.detach().double()[k] for v, k in zip(values, keep, strict=True)], packed)
        packed_rewards = pad_samples([r.detach().double()[k] for r, k in zip(rewards, keep, strict=True)], packed)
        bootstrap = [0.0] * count if bootstrap_values is None else [float(b) for b in bootstrap_values]
        for i, length in enumerate(kept_lengths):
            if length:
                packed_rewards[i, length - 1] += float(terminal_rewards[i]) + gamma * bootstrap[i]
        gae = chunked_gae if chunked else vanilla_gae
        packed_advantages, packed_returns = gae(packed_rewards, packed_values, gamma, lambd)
        advantages_list, returns_list = [], []
        for packed_result, out in ((packed_advantages, advantages_list), (packed_returns, returns_list)):
            pieces = packed_result[packed].split(kept_lengths)
            for i, (piece, kept) in enumerate(zip(pieces, keep, strict=True)):
                full = torch.zeros(response_lengths[i], dtype=dtype, device=values_list[i].device)
                full[kept] = piece.to(dtype)
                out.append(slice_log_prob_with_cp(full, total_lengths[i], response_lengths[i], qkv_format,
                                                  max_lens[i]))
    return advantages_list, returns_list


def get_advantages_and_returns(
    total_len: int, response_len: int, values: torch.Tensor, rewards: torch.Tensor, gamma: float, lambd: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over every token of one sample's response (upstream's per-sample form): ``values``/``rewards`` ``(T,)``,
    ``get_advantages_and_returns_batch`` with every token trainable and no terminal reward. Returns ``(A, R)``."""
    advantages, returns = get_advantages_and_returns_batch(
        [total_len], [response_len], [values], [rewards], [0.0], "thd", None, [torch.ones(response_len)], gamma,
        lambd, chunked=False,
    )
    return advantages[0], returns[0]


def get_grpo_returns(rewards: torch.Tensor, kl: list[torch.Tensor]) -> list[torch.Tensor]:
    """GRPO's returns: sample i's (already group-normalized) reward on every token, shaped like ``kl[i]``."""
    return [torch.ones_like(k) * rewards[i] for i, k in enumerate(kl)]


def get_reinforce_plus_plus_returns(
    rewards: torch.Tensor,
    kl: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    response_lengths: list[int],
    total_lengths: list[int],
    kl_coef: float,
    gamma: float,
) -> list[torch.Tensor]:
    """REINFORCE++ discounted returns (https://arxiv.org/abs/2501.03262) over each sample's trainable tokens.

        r_t = −kl_coef·kl_t (+ rewards[i] at the last trainable token)
        G_t = r_t + γ·G_{t+1},   G after the last token = 0
    This is GAE with V = 0 and λ = 1 (δ_t = r_t), so it is ``get_advantages_and_returns_batch``'s recursion; masked
    tokens are skipped as if absent and get 0, a fully masked sample gets zeros. Returns one ``(T_i,)`` per sample.
    """
    token_rewards = [-kl_coef * k.detach() for k in kl]
    returns, _ = get_advantages_and_returns_batch(
        total_lengths, response_lengths, [torch.zeros_like(r) for r in token_rewards], token_rewards,
        [float(r) for r in rewards], "thd", None, loss_masks, gamma, 1.0, chunked=False,
    )
    return returns


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


def compute_gspo_kl(
    full_log_probs: list[torch.Tensor],
    full_old_log_probs: list[torch.Tensor],
    local_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
) -> torch.Tensor:
    """GSPO's sequence-level log-ratio, broadcast back to the tokens (upstream's signature: per-sample lists).

    For sample i: s_i = Σ_t m_t·(old_t − lp_t) / max(Σ_t m_t, 1), masked tokens (even NaN) left out; each of its
    tokens gets s_i, shaped like ``local_log_probs[i]`` (this context-parallel rank's tokens: all of them here). A
    fully masked sample gets 0. Gradients flow to every unmasked token of the sample. Returns ``(Σ T_i,)``.
    """
    per_sample = []
    for log_probs, old_log_probs, local, mask in zip(full_log_probs, full_old_log_probs, local_log_probs, loss_masks,
                                                    strict=True):
        row_sum, count = _row_sum_and_count(old_log_probs - log_probs, mask)
        per_sample.append((row_sum / count.clamp_min(1.0)).expand_as(local))
    return torch.cat(per_sample)


def opsm_keep(
    denominator: torch.Tensor, log_probs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, delta: float
) -> torch.Tensor:
    """OPSM, ``(B, T)`` bool: False where A_t < 0 and the sequence's κ exceeds ``delta``.

        keep_t = ¬(A_t < 0 ∧ κ_i > δ),   κ_i = Σ_s m_s·(den_s − lp_s) / max(Σ_s m_s, 1)
    ``denominator`` is the PPO ratio's denominator ("old"), ``log_probs`` the current policy's. Upstream's rule per
    token (with GRPO every token of a sequence has the same advantage; with PPO's GAE they may differ). Source:
    DeepSeek-V3.2 (https://arxiv.org/abs/2512.02556), upstream ``compute_opsm_mask``."""
    with torch.no_grad():
        row_sum, count = _row_sum_and_count(denominator - log_probs, mask)
        kappa = (row_sum / count.clamp_min(1.0)).unsqueeze(-1)  # (B, 1)
        return ~((advantages < 0) & (kappa > delta))


def compute_opsm_mask(
    args,
    full_log_probs: list[torch.Tensor],
    full_old_log_probs: list[torch.Tensor],
    advantages: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPSM with upstream's signature (``args.opsm_delta`` is δ): per-sample lists in, the ``opsm_keep`` rule.

    Returns ``(opsm_mask, opsm_clipfrac)``: the per-token keep mask of all samples concatenated, 0.0 where
    A_t < 0 and the sample's κ = Σ m·(old − lp) / max(Σ m, 1) exceeds δ, else 1.0; and
    Σ_i (masked tokens of i) / max(Σ m_i, 1), upstream's sum of each sample's fraction of masked tokens."""
    valid = valid_positions([lp.numel() for lp in full_log_probs])
    masks = pad_samples([m.detach().to(full_log_probs[0].dtype) for m in loss_masks], valid)
    keep = opsm_keep(pad_samples([o.detach() for o in full_old_log_probs], valid),
                     pad_samples([lp.detach() for lp in full_log_probs], valid),
                     pad_samples([a.detach() for a in advantages], valid), masks, args.opsm_delta)
    dropped = (~keep & valid).to(masks.dtype)
    clipfrac = (dropped.sum(dim=-1) / masks.sum(dim=-1).clamp_min(1.0)).sum()
    return keep[valid].to(masks.dtype), clipfrac


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
