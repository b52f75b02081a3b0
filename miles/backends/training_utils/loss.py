"""The glue from a micro-batch of per-sample tensors to ``(loss, metrics)``: policy, value and SFT losses.

A ``batch`` is a plain dict of lists of per-sample 1-D tensors over the response tokens:
``loss_masks``, ``advantages``, ``old_log_probs`` (the denominator recomputed once per rollout, before its
first optimizer step; may be absent under ``--use-rollout-logprobs``), ``rollout_log_probs`` (may be None),
``ref_log_probs`` (may be None), ``returns``, ``old_values``. Everything in ``batch`` is a constant (detached
here); gradients flow only to the ``log_probs``, ``entropy`` and ``values`` arguments.

Gradient scale never depends on micro-batching (docs/design.md §7): each loss is divided by ``step_divisor``, the
number of samples (or, with ``--calculate-per-token-loss``, of unmasked tokens) of the optimizer step's whole
batch, so summing the micro-batches' losses gives the full batch's loss and gradient.

Metrics are plain floats for the micro-batch, always the *sample mean*: each sample's masked token mean, then
the mean over the micro-batch's samples that have at least one unmasked token (0.0 when none has), whatever
the loss reduction. Fully masked samples are left out so they cannot drag a ratio metric (tis, ess_ratio)
towards 0. To combine micro-batches, weight each by its number of such samples. ``loss`` is the same
combination of the metric terms as the loss (pg_loss − entropy_coef·entropy_loss + kl_loss_coef·kl_loss), in
sample-mean terms.

Departures from upstream miles semantics:
- Per-token inputs are zeroed outside the loss mask before any arithmetic, so NaN or ±inf at masked positions
  cannot reach the loss or its gradient; at unmasked positions non-finite log-ratios are clamped
  (``compute_policy_loss``) but non-finite advantages are not hidden.
- ``ois`` is token-level, exp(clamp(lp − old, ±20)), also under GSPO (upstream uses the sequence ratio there).
- The TIS metrics under ``--get-mismatch-metrics`` compare ``old_log_probs`` (when present) with the rollout
  log-probs, even when the rollout log-probs are the denominator.
- Metrics leave fully masked samples out of their sample mean (upstream counts them as 0).
- ``ess_ratio`` is the sample mean of the per-sample ESS ratio of w = exp(lp − old) (token-level also
  under GSPO); upstream sums it per micro-batch.
- ``entropy_loss`` is 0.0 when no entropy is passed (allowed only with entropy_coef 0).
- The per-token divisor is the whole step's number of unmasked tokens, at least 1 (upstream clamps each
  sample's count at 1 before summing).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import torch

from miles.backends.training_utils.advantages import ADVANTAGE_ESTIMATORS
from miles.backends.training_utils.loss_hub.corrections import load_weight_function
from miles.backends.training_utils.parallel import get_parallel_state
from miles.backends.training_utils.loss_hub.math_utils import (
    KL_LOSS_TYPES,
    compute_approx_kl,
    compute_ess_ratio,
    compute_gspo_kl,
    compute_policy_loss,
    compute_value_loss,
    opsm_keep,
    pad_samples,
    safe_log_ratio,
    sum_of_sample_mean,
    sum_of_token,
    valid_positions,
)
from miles.config import corrections
from miles.config.corrections import InEffect


@dataclass(frozen=True)
class LossConfig:
    """The flags the losses read, and nothing else. Defaults are the parser's (a test keeps them in step)."""

    advantage_estimator: str = "grpo"
    eps_clip: float = 0.2
    eps_clip_high: float | None = None  # None: eps_clip
    eps_clip_c: float | None = None  # dual clip off
    value_clip: float = 0.2
    # the corrections table's rows in effect: the loss asks them where "old" comes from and what re-weights it
    corrections: InEffect = InEffect()
    use_opsm: bool = False
    opsm_delta: float = 1e-4
    get_mismatch_metrics: bool = False
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "k1"
    use_unbiased_kl: bool = False  # KL loss weighted by π_θ/π_old (the parser's --use-unbiased-kl)
    entropy_coef: float = 0.0
    calculate_per_token_loss: bool = False
    # What the weight functions receive as ``args`` (upstream's TIS-hook signature; the built-ins read their
    # --tis-* scalars from it): the run's namespace (``from_args``), else a namespace holding those flags.
    hook_args: Any = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.eps_clip_high is None:
            object.__setattr__(self, "eps_clip_high", self.eps_clip)
        _check_config(self)

    @classmethod
    def from_args(cls, args) -> LossConfig:
        """Read exactly these fields' attribute names from an argparse namespace (a missing one is an error); the
        corrections come from the table's rows (``corrections.in_effect``)."""
        names = [field.name for field in dataclasses.fields(cls) if field.name not in ("hook_args", "corrections")]
        return cls(**{name: getattr(args, name) for name in names}, corrections=corrections.in_effect(args),
                   hook_args=args)

    @functools.cached_property
    def weight_functions(self) -> tuple:
        """The weight functions the loss runs: the chosen rows' (applied, in the table's order), else under
        get_mismatch_metrics the metrics-only row's (run for its metrics alone, ``_corrections``), else none."""
        paths = self.corrections.weight_functions
        if not paths and self.get_mismatch_metrics:
            paths = (corrections.metrics_only_function(),)
        return tuple(load_weight_function(path) for path in paths)


def _check_config(cfg: LossConfig) -> None:
    if cfg.advantage_estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"advantage_estimator is {cfg.advantage_estimator!r}, but it must be one of "
            f"{', '.join(ADVANTAGE_ESTIMATORS)}."
        )
    if cfg.kl_loss_type not in KL_LOSS_TYPES:
        raise ValueError(f"kl_loss_type is {cfg.kl_loss_type!r}, but it must be one of {', '.join(KL_LOSS_TYPES)}.")
    if cfg.eps_clip_c is not None and cfg.eps_clip_c <= 1.0:
        raise ValueError(f"eps_clip_c is {cfg.eps_clip_c}, but the dual-clip constant must be > 1. Pass e.g. 3.0.")
    if cfg.weight_functions and cfg.hook_args is None:
        raise ValueError(
            f"the corrections in effect ({cfg.corrections.label}) or get_mismatch_metrics run a weight function, "
            "but hook_args is None: pass the run's namespace (LossConfig.from_args) or one holding the --tis-* flags."
        )


def step_divisor(loss_masks: list[torch.Tensor], per_token: bool) -> float:
    """The divisor of one optimizer step: its number of samples, or (per_token) of unmasked tokens, at least 1.

    ``loss_masks`` must be those of the step's *whole* batch, not of one micro-batch.
    """
    if not per_token:
        return float(len(loss_masks))
    return max(float(sum(int((mask != 0).sum()) for mask in loss_masks)), 1.0)


@dataclass(frozen=True)
class _Tokens:
    """Where a micro-batch's response tokens sit in a padded ``(B, T)`` layout."""

    mask: torch.Tensor  # (B, T) bool: True at unmasked response tokens, False at masked and padding positions
    valid: torch.Tensor  # (B, T) bool: True at the response tokens, False at padding
    lengths: tuple[int, ...]  # response length of each sample
    samples_with_tokens: int  # samples with at least one unmasked token: the metrics' denominator

    @classmethod
    def of(cls, loss_masks: list[torch.Tensor]) -> _Tokens:
        if len(loss_masks) == 0:
            raise ValueError("the micro-batch has no samples; pass at least one sample per loss call.")
        lengths = tuple(m.numel() for m in loss_masks)
        valid = valid_positions(lengths)
        mask = pad_samples(list(loss_masks), valid) != 0  # padding is 0, so False
        return cls(mask, valid, lengths, int(mask.any(dim=-1).sum()))

    def pad(self, tensors: list[torch.Tensor] | None, name: str) -> torch.Tensor:
        """Per-sample 1-D tensors → ``(B, T)``, zero outside the mask (so NaN/inf there never propagate)."""
        if tensors is None:
            raise ValueError(f"{name} is missing (None), but this loss needs it: pass one tensor per sample.")
        lengths = tuple(t.numel() if t.dim() == 1 else -1 for t in tensors)
        if lengths != self.lengths:
            raise ValueError(
                f"{name} has per-sample lengths {list(lengths)}, but loss_masks has {list(self.lengths)}: pass "
                "one 1-D tensor per sample over its response tokens."
            )
        padded = pad_samples(tensors, self.valid)
        return torch.where(self.mask, padded, torch.zeros((), dtype=padded.dtype))

    def unpad(self, padded: torch.Tensor) -> list[torch.Tensor]:
        """``(B, T)`` → one 1-D tensor per sample over its response tokens (the hook's layout)."""
        return [row[:length] for row, length in zip(padded, self.lengths)]

    def repad(self, per_token) -> torch.Tensor:
        """A hook's per-token values (``(Σ T_i,)``, a list of per-sample tensors, or a number) → ``(B, T)``, 0 at
        padding (a number fills every position)."""
        if isinstance(per_token, (list, tuple)):
            per_token = torch.cat([torch.as_tensor(t).reshape(-1) for t in per_token])
        per_token = torch.as_tensor(per_token)
        if per_token.dim() == 0:
            return per_token.expand(self.valid.shape).to(torch.float32)
        return pad_samples([per_token.reshape(-1)], self.valid)

    def reduce(self, per_token: torch.Tensor, token_sum: bool, divisor: float) -> torch.Tensor:
        """The loss reduction: ``sum_of_token`` or ``sum_of_sample_mean``, divided by the step's divisor."""
        reduction = sum_of_token if token_sum else sum_of_sample_mean
        return reduction(per_token, self.mask, divisor)

    def metric(self, per_token: torch.Tensor) -> float:
        """Mean over the samples with tokens of their masked token means (see the module docstring)."""
        return self.sample_mean(sum_of_sample_mean(per_token.detach(), self.mask, divisor=1.0))

    def sample_mean(self, total_over_samples: torch.Tensor) -> float:
        """A sum over samples (fully masked ones contributing 0) → the mean over the samples with tokens."""
        return float(total_over_samples) / max(self.samples_with_tokens, 1)


def _denominator(cfg: LossConfig, batch: dict) -> list[torch.Tensor]:
    """The PPO ratio's denominator, where the rows in effect say: the rollout log-probs (ROLLOUT), else
    old_log_probs (recomputed with a snapshot, SNAPSHOT, or with the current actor, CURRENT)."""
    if cfg.corrections.denominator == corrections.ROLLOUT:
        if batch.get("rollout_log_probs") is None:
            raise ValueError(
                f"the denominator of {cfg.corrections.label} is the rollout log-probs, but batch['rollout_log_probs'] "
                "is missing: the rollout engine must return per-token log-probs for every sample."
            )
        return batch["rollout_log_probs"]
    if batch.get("old_log_probs") is None:
        raise ValueError(
            f"batch['old_log_probs'] is missing, but it is the ratio's denominator under {cfg.corrections.label}: "
            "compute it once per rollout, before the first optimizer step."
        )
    return batch["old_log_probs"]


def policy_loss(
    cfg: LossConfig,
    batch: dict,
    log_probs: list[torch.Tensor],
    entropy: list[torch.Tensor] | None,
    step_divisor: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped PPO/GSPO policy loss of one micro-batch, with optional TIS, entropy bonus and KL loss.

        ppo_kl = old − lp (GSPO: its per-sequence masked mean, broadcast)      old: see ``_denominator``
        pg     = compute_policy_loss(ppo_kl, A, eps_clip, eps_clip_high, eps_clip_c)   [× TIS weights]
        loss   = reduce(pg) − entropy_coef·reduce(entropy) + kl_loss_coef·reduce(KL(lp ‖ ref))
    ``reduce`` is ``sum_of_sample_mean`` (or ``sum_of_token`` with calculate_per_token_loss) divided by
    ``step_divisor``. Returns ``(loss, metrics)``; metric names and reduction in the module docstring.
    """
    tokens = _Tokens.of(batch["loss_masks"])
    lp = tokens.pad(log_probs, "log_probs")  # (B, T), carries grad
    old = tokens.pad(_denominator(cfg, batch), "the denominator log-probs").detach()  # (B, T)
    advantages = tokens.pad(batch.get("advantages"), "advantages").detach()  # (B, T)
    token_ppo_kl = old - lp  # (B, T)
    ppo_kl = token_ppo_kl
    if cfg.advantage_estimator == "gspo":
        lp_list, masks = tokens.unpad(lp), tokens.unpad(tokens.mask)
        ppo_kl = tokens.repad(compute_gspo_kl(lp_list, tokens.unpad(old), lp_list, masks))
    pg_losses, pg_clipfrac = compute_policy_loss(ppo_kl, advantages, cfg.eps_clip, cfg.eps_clip_high, cfg.eps_clip_c)
    pg_losses, loss_tokens, metrics = _corrections(cfg, batch, tokens, old, lp, advantages, pg_losses)
    reduce = functools.partial(loss_tokens.reduce, token_sum=cfg.calculate_per_token_loss, divisor=step_divisor)
    loss = reduce(pg_losses)
    metrics.update(
        pg_loss=tokens.metric(pg_losses),
        pg_clipfrac=tokens.metric(pg_clipfrac),
        ppo_kl=tokens.metric(ppo_kl),
        ess_ratio=tokens.sample_mean(compute_ess_ratio(-token_ppo_kl, tokens.mask).sum()),
        entropy_loss=0.0,
    )
    metric_loss = metrics["pg_loss"]
    if entropy is not None:
        entropy_bt = tokens.pad(entropy, "entropy")
        metrics["entropy_loss"] = tokens.metric(entropy_bt)
        if cfg.entropy_coef != 0:
            loss = loss - cfg.entropy_coef * reduce(entropy_bt)
            metric_loss -= cfg.entropy_coef * metrics["entropy_loss"]
    elif cfg.entropy_coef != 0:
        raise ValueError(f"entropy_coef is {cfg.entropy_coef}, but no entropy was passed: compute it in the forward.")
    if cfg.use_kl_loss:
        kl = _kl_loss_per_token(cfg, batch, tokens, lp, old)
        loss = loss + cfg.kl_loss_coef * reduce(kl)
        metrics["kl_loss"] = tokens.metric(kl)
        metric_loss += cfg.kl_loss_coef * metrics["kl_loss"]
    metrics.update(_denominator_vs_rollout(batch, tokens, old))
    metrics["loss"] = metric_loss
    return loss, metrics


def _corrections(
    cfg: LossConfig, batch: dict, tokens: _Tokens, old: torch.Tensor, lp: torch.Tensor, advantages: torch.Tensor,
    pg_losses: torch.Tensor,
) -> tuple[torch.Tensor, _Tokens, dict[str, float]]:
    """OPSM, then the weight functions of the rows in effect (``cfg.weight_functions``, upstream's TIS-hook
    signature, each applied to the previous one's loss and masks): the corrected per-token loss (B, T), the tokens
    the loss reduction keeps, and their metrics.

    Under get_mismatch_metrics with no row that weights the loss, the metrics-only row's function runs for its
    metrics; its weights and masks then are not applied. Metrics are means over the tokens of the original loss
    mask (before any correction's mask)."""
    metrics: dict[str, float] = {}
    if cfg.use_opsm:
        keep = opsm_keep(old, lp.detach(), advantages, tokens.mask, cfg.opsm_delta)
        pg_losses = torch.where(keep, pg_losses, torch.zeros_like(pg_losses))
        metrics["opsm_clipfrac"] = tokens.metric((~keep).to(pg_losses.dtype))
    if not cfg.weight_functions:
        return pg_losses, tokens, metrics
    if batch.get("rollout_log_probs") is None:
        raise ValueError(
            f"{cfg.corrections.label} (or get_mismatch_metrics) weighs the loss by the rollout log-probs, but "
            "batch['rollout_log_probs'] is missing: the rollout engine must return per-token log-probs for every "
            "sample."
        )
    rollout = tokens.pad(batch["rollout_log_probs"], "rollout_log_probs").detach()
    recomputed = old if batch.get("old_log_probs") is None else tokens.pad(batch["old_log_probs"], "old_log_probs")
    response_lengths = list(tokens.lengths)
    corrected, kept_masks = pg_losses[tokens.valid], tokens.unpad(tokens.mask.to(pg_losses.dtype))
    for weigh in cfg.weight_functions:
        corrected, kept_masks, weight_metrics = weigh(
            cfg.hook_args, pg_loss=corrected, train_log_probs=tokens.unpad(recomputed.detach()),
            rollout_log_probs=tokens.unpad(rollout), loss_masks=kept_masks,
            # upstream's keywords for the context-parallel layout (cp_utils); a batch without prompt lengths (a
            # test of the loss alone) passes its response lengths, which the one-rank layout never reads
            total_lengths=list(batch.get("total_lengths") or response_lengths), response_lengths=response_lengths,
            max_seq_lens=None, parallel_state=get_parallel_state(),
        )
        metrics.update({name: tokens.metric(tokens.repad(value)) for name, value in weight_metrics.items()})
    metrics["ois"] = tokens.metric(safe_log_ratio(lp.detach() - old).exp())
    if not cfg.corrections.weight_functions:
        return pg_losses, tokens, metrics
    kept = tokens.repad(torch.cat(list(kept_masks))) != 0
    return tokens.repad(corrected), dataclasses.replace(tokens, mask=tokens.mask & kept), metrics


def _kl_loss_per_token(cfg: LossConfig, batch: dict, tokens: _Tokens, lp: torch.Tensor, old: torch.Tensor):
    """KL(π_θ ‖ π_ref) per token (B, T), optionally weighted by π_θ/π_old (use_unbiased_kl)."""
    if batch.get("ref_log_probs") is None:
        raise ValueError(
            "use_kl_loss is set, but batch['ref_log_probs'] is missing: compute the reference model's log-probs "
            "(--ref-load) for every sample."
        )
    ref = tokens.pad(batch["ref_log_probs"], "ref_log_probs").detach()
    importance_ratio = safe_log_ratio(lp - old).exp() if cfg.use_unbiased_kl else None
    return compute_approx_kl(lp, ref, cfg.kl_loss_type, importance_ratio)


def _denominator_vs_rollout(batch: dict, tokens: _Tokens, old: torch.Tensor) -> dict[str, float]:
    """train_rollout_logprob_abs_diff = mean |old − roll|; train_rollout_kl = low_var_kl k3 of KL(roll ‖ old)."""
    if batch.get("rollout_log_probs") is None:
        return {}
    rollout = tokens.pad(batch["rollout_log_probs"], "rollout_log_probs").detach()
    return {
        "train_rollout_logprob_abs_diff": tokens.metric((old - rollout).abs()),
        "train_rollout_kl": tokens.metric(compute_approx_kl(rollout, old, "low_var_kl")),
    }


def value_loss(
    cfg: LossConfig, batch: dict, values: list[torch.Tensor], step_divisor: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped critic loss of one micro-batch: reduce(max((v_clip − R)², (v − R)²)) / step_divisor.

    v_clip = v_old + clamp(v − v_old, ±value_clip), R = batch['returns'], v_old = batch['old_values'].
    Metrics: value_loss, value_clipfrac (sample means, see the module docstring).
    """
    tokens = _Tokens.of(batch["loss_masks"])
    new_values = tokens.pad(values, "values")  # (B, T), carries grad
    old_values = tokens.pad(batch.get("old_values"), "old_values").detach()
    returns = tokens.pad(batch.get("returns"), "returns").detach()
    losses, clipfrac = compute_value_loss(new_values, old_values, returns, cfg.value_clip)
    loss = tokens.reduce(losses, cfg.calculate_per_token_loss, step_divisor)
    return loss, {"value_loss": tokens.metric(losses), "value_clipfrac": tokens.metric(clipfrac)}
