"""A rollout's rewards → per-sample advantages and returns, for each advantage estimator (docs/design.md §7).

One function, ``compute_advantages_and_returns``, picks the estimator from ``ADVANTAGE_ESTIMATORS`` (a plain
dict from name to function). Every estimator returns one 1-D tensor per sample over its response tokens,
without grad, and 0 at loss-mask-0 positions:
- grpo, gspo: A = group-normalized reward, broadcast to the response tokens; returns = A.
- ppo: token rewards (reward at the last unmasked token, −kl_coef·kl per token when given), GAE with the
  critic's values over the unmasked tokens; returns = A + V.
- reinforce_plus_plus: the same token rewards, discounted returns over the unmasked tokens; A = returns.
- reinforce_plus_plus_baseline: A = reward − its group mean, broadcast, − kl_coef·kl per token; returns = A.
With ``normalize``, the advantages (not the returns) are whitened over every unmasked token of the rollout.

Departures from upstream miles semantics:
- Every estimator writes 0 at loss-mask-0 positions (upstream broadcasts the reward to them; they never reach
  a loss), and the KL shaping acts on unmasked tokens only.
- REINFORCE++ discounts over the unmasked tokens as if the masked ones were absent (upstream discounts across
  them; PPO's GAE skips them in both, and puts the reward at the last unmasked token in both).
- A REINFORCE++ sample with no unmasked token gets zeros (upstream asserts).
- ``kl_coef`` ≠ 0 with grpo or gspo is an error (upstream ignores it silently); ``kl_coef`` ≠ 0 without ``kl``
  is an error too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from miles.backends.training_utils.loss_hub.math_utils import (
    get_advantages_and_returns_batch,
    get_grpo_returns,
    get_reinforce_plus_plus_returns,
    group_normalize_rewards,
    normalize_advantages,
    pad_samples,
    valid_positions,
)


@dataclass(frozen=True)
class _Rollout:
    """The inputs every estimator may read, checked for consistency once."""

    rewards: torch.Tensor  # (N,) one scalar reward per sample, float32
    loss_masks: list[torch.Tensor]  # N × (T_i,)
    values: list[torch.Tensor] | None  # N × (T_i,), critic values (ppo only)
    kl: list[torch.Tensor] | None  # N × (T_i,), per-token KL(π ‖ π_ref) estimate for reward shaping
    kl_coef: float
    group_size: int
    gamma: float
    lambd: float
    std_normalization: bool

    # The whole rollout in one padded (N, T_max) layout, so the per-token shaping is a few tensor operations
    # rather than a few per sample (a rollout has tens to thousands of samples; each small op costs ~10 µs).
    @functools.cached_property
    def valid(self) -> torch.Tensor:
        """(N, T_max) bool: True at each sample's response tokens, False at padding."""
        return valid_positions([mask.numel() for mask in self.loss_masks])

    @functools.cached_property
    def unmasked(self) -> torch.Tensor:
        """(N, T_max) bool: True at unmasked response tokens."""
        return pad_samples([mask != 0 for mask in self.loss_masks], self.valid) if self.loss_masks else self.valid

    @property
    def response_lengths(self) -> list[int]:
        return [mask.numel() for mask in self.loss_masks]

    def unpad(self, padded: torch.Tensor) -> list[torch.Tensor]:
        """(N, T_max) → one 1-D tensor per sample over its response tokens (views into one flat tensor)."""
        return list(padded[self.valid].split([mask.numel() for mask in self.loss_masks]))

    @functools.cached_property
    def masked_kl(self) -> torch.Tensor:
        """kl on the unmasked tokens, 0 elsewhere (zeros without KL shaping). (N, T_max)"""
        if self.kl is None or self.kl_coef == 0:
            return torch.zeros(self.valid.shape, dtype=self.rewards.dtype)
        kl = pad_samples([k.detach().to(self.rewards.dtype) for k in self.kl], self.valid)
        return torch.where(self.unmasked, kl, 0.0)

    @property
    def kl_penalty(self) -> torch.Tensor:
        """−kl_coef·kl on the unmasked tokens, 0 elsewhere. (N, T_max)"""
        return -self.kl_coef * self.masked_kl

    def broadcast(self, per_sample: torch.Tensor) -> list[torch.Tensor]:
        """Sample i's scalar on its unmasked tokens (upstream's ``get_grpo_returns``), 0 elsewhere, plus the KL
        penalty."""
        returns = get_grpo_returns(per_sample, self.loss_masks)
        return [torch.where(mask != 0, r, 0.0).to(per_sample.dtype) + penalty
                for r, mask, penalty in zip(returns, self.loss_masks, self.unpad(self.kl_penalty), strict=True)]


def _group_relative(rollout: _Rollout) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """GRPO/GSPO: A_i = (r_i − mean_g) / (std_g + 1e-6) on every unmasked token; returns = A."""
    normalized = group_normalize_rewards(rollout.rewards, rollout.group_size, rollout.std_normalization)
    advantages = rollout.broadcast(normalized)
    return advantages, advantages


def _gae(rollout: _Rollout) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """PPO: GAE over the unmasked tokens with the critic's values, the reward at the last unmasked token."""
    values = [v.detach() for v in rollout.values]
    kl_rewards = [r.to(v.dtype) for r, v in zip(rollout.unpad(rollout.kl_penalty), values, strict=True)]
    lengths = rollout.response_lengths
    # total_lengths = response lengths: the prompt length only places a sample in a context-parallel split (cp_utils)
    return get_advantages_and_returns_batch(
        lengths, lengths, values, kl_rewards, rollout.rewards.tolist(), "thd", None, rollout.loss_masks,
        rollout.gamma, rollout.lambd,
    )


def _reinforce_plus_plus(rollout: _Rollout) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """REINFORCE++: G_t = r_t + γ·G_{t+1} over the unmasked tokens; A = G."""
    lengths = rollout.response_lengths
    returns = get_reinforce_plus_plus_returns(
        rollout.rewards, rollout.unpad(rollout.masked_kl), rollout.loss_masks, lengths, lengths, rollout.kl_coef,
        rollout.gamma,
    )
    return returns, returns


def _reinforce_plus_plus_baseline(rollout: _Rollout) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """REINFORCE++-baseline: A_i = r_i − mean_g on every unmasked token, − kl_coef·kl_t; returns = A."""
    centered = group_normalize_rewards(rollout.rewards, rollout.group_size, std_normalization=False)
    advantages = rollout.broadcast(centered)
    return advantages, advantages


ADVANTAGE_ESTIMATORS = {
    "grpo": _group_relative,
    "gspo": _group_relative,
    "ppo": _gae,
    "reinforce_plus_plus": _reinforce_plus_plus,
    "reinforce_plus_plus_baseline": _reinforce_plus_plus_baseline,
}


def compute_advantages_and_returns(
    estimator: str,
    rewards: list[float],
    loss_masks: list[torch.Tensor],
    values: list[torch.Tensor] | None,
    group_size: int,
    gamma: float,
    lambd: float,
    std_normalization: bool,
    normalize: bool,
    kl: list[torch.Tensor] | None = None,
    kl_coef: float = 0.0,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-sample ``(advantages, returns)`` of one rollout under ``estimator`` (formulas in the module docstring).

    ``rewards``: one scalar per sample, samples of one prompt contiguous in groups of ``group_size``;
    ``loss_masks``/``values``/``kl``: one 1-D tensor per sample over its response tokens. ``normalize``:
    whiten the advantages over all unmasked tokens of the rollout (``normalize_advantages``).
    """
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"advantage estimator {estimator!r} is unknown; valid names: {', '.join(ADVANTAGE_ESTIMATORS)}."
        )
    rollout = _Rollout(
        torch.tensor(rewards, dtype=torch.float32), list(loss_masks), values, kl, kl_coef, group_size, gamma,
        lambd, std_normalization,
    )
    _check_rollout(estimator, rollout)
    advantages, returns = ADVANTAGE_ESTIMATORS[estimator](rollout)
    if normalize:
        advantages = _whiten_rollout(advantages, rollout.loss_masks)
    return advantages, returns


def _whiten_rollout(advantages: list[torch.Tensor], loss_masks: list[torch.Tensor]) -> list[torch.Tensor]:
    whitened = normalize_advantages(torch.cat(advantages), torch.cat(loss_masks))
    return list(whitened.split([a.numel() for a in advantages]))


def _check_rollout(estimator: str, rollout: _Rollout) -> None:
    num_samples = len(rollout.loss_masks)
    if rollout.rewards.numel() != num_samples:
        raise ValueError(f"got {rollout.rewards.numel()} rewards for {num_samples} loss masks; pass one per sample.")
    lengths = [m.numel() for m in rollout.loss_masks]
    if estimator == "ppo" and rollout.values is None:
        raise ValueError("advantage estimator 'ppo' needs the critic's values (one tensor per sample), got None.")
    for name, tensors in (("values", rollout.values), ("kl", rollout.kl)):
        if tensors is not None and [t.numel() for t in tensors] != lengths:
            raise ValueError(
                f"{name} has per-sample lengths {[t.numel() for t in tensors]}, but loss_masks has {lengths}."
            )
    if rollout.kl_coef != 0 and estimator in ("grpo", "gspo"):
        raise ValueError(
            f"kl_coef is {rollout.kl_coef}, but {estimator} does not shape its reward with a KL penalty. Use "
            "--use-kl-loss --kl-loss-coef instead, and set --kl-coef 0."
        )
    if rollout.kl_coef != 0 and rollout.kl is None:
        raise ValueError(f"kl_coef is {rollout.kl_coef}, but no per-token kl was passed; pass kl, or kl_coef 0.")


@dataclass(frozen=True)
class AdvantageConfig:
    """The flags the trainers' advantage preparation reads, built once from ``args``."""

    estimator: str
    group_size: int  # --n-samples-per-prompt
    gamma: float
    lambd: float
    std_normalization: bool  # --grpo-std-normalization
    normalize: bool  # --normalize-advantages
    kl_coef: float  # the reward's KL penalty (needs reference log-probs when not 0)

    @classmethod
    def from_args(cls, args) -> AdvantageConfig:
        return cls(args.advantage_estimator, args.n_samples_per_prompt, args.gamma, args.lambd,
                   args.grpo_std_normalization, args.normalize_advantages, args.kl_coef)


def policy_advantages(
    config: AdvantageConfig, rewards: list[float], loss_masks: list[torch.Tensor], values: list[torch.Tensor] | None,
    old_log_probs: list[torch.Tensor] | None, rollout_log_probs: list[torch.Tensor],
    ref_log_probs: list[torch.Tensor] | None,
) -> list[torch.Tensor]:
    """The actor's advantages of one rollout; the reward's KL penalty, when on, is kl = base − ref per token, base
    the recomputed denominator or (when none was recomputed) the engine's log-probs."""
    kl = None
    if config.kl_coef != 0:
        base = old_log_probs if old_log_probs is not None else rollout_log_probs
        kl = [b - r for b, r in zip(base, ref_log_probs, strict=True)]
    advantages, _ = compute_advantages_and_returns(
        config.estimator, rewards, loss_masks, values, config.group_size, config.gamma, config.lambd,
        config.std_normalization, config.normalize, kl=kl, kl_coef=config.kl_coef)
    return advantages


def critic_returns(config: AdvantageConfig, rewards: list[float], loss_masks: list[torch.Tensor],
                   old_values: list[torch.Tensor]) -> list[torch.Tensor]:
    """The critic's regression targets: GAE returns R = A + V under the old values, never whitened."""
    _, returns = compute_advantages_and_returns("ppo", rewards, loss_masks, old_values, config.group_size,
                                                config.gamma, config.lambd, std_normalization=True, normalize=False)
    return returns
