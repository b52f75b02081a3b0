"""Upstream's ``--custom-tis-function-path`` hook: its signature, its two built-ins, the built-in of the MIS flags.

A TIS function has upstream's signature::

    fn(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs) -> (pg_loss, loss_masks, metrics)

``kwargs`` holds upstream's other keywords: ``total_lengths``, ``response_lengths`` (one int per sample),
``max_seq_lens`` (None) and ``parallel_state`` (the process's layout, ``parallel.get_parallel_state()``).

``pg_loss`` is the per-token policy loss of the micro-batch's response tokens concatenated, ``(Σ T_i,)``;
``train_log_probs`` (the recomputed π_old), ``rollout_log_probs`` and ``loss_masks`` are lists of one 1-D tensor
per sample. It returns the re-weighted ``pg_loss`` (same shape), the loss masks the reduction uses (a token set to
0 leaves the loss) and per-token metrics ``{name: (Σ T_i,) tensor}`` (averaged like the loss metrics). ``args`` is
the run's argparse namespace (the loss configuration when the loss is called without one). Any such function is
applied only under ``--use-tis`` (docs/corrections.md).

The functions here read their scalars from ``args`` and delegate at once to the pure math of ``tis.py`` (the TIS row's module):
``vanilla_tis_function`` w = clamp(r, tis_clip_low, tis_clip), ``icepop_function`` w = r inside [tis_clip_low,
tis_clip] and 0 outside, with r = exp(train − rollout) per token (upstream's formulas); ``configured_tis_function``
the built-in of --tis-mode / --tis-level / --rs-level / --rs-veto-threshold (the default under --use-tis).
"""

from __future__ import annotations

from typing import Any

import torch

from miles.backends.training_utils.loss_hub.math_utils import pad_samples, valid_positions
from miles.backends.training_utils.loss_hub.tis import TISChoice, bounded_weights, level_ratio, tis_weights
from miles.config.hooks import load_function

BUILTIN_PREFIX = __name__  # "miles.backends.training_utils.loss_hub.corrections"


def _padded(tensors: list[torch.Tensor], valid: torch.Tensor) -> torch.Tensor:
    return pad_samples([t.detach() for t in tensors], valid)


def _per_token(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` → the response tokens concatenated, ``(Σ T_i,)`` (the hook's layout)."""
    return values[valid]


def bounded_token_ratio(
    pg_loss: torch.Tensor, train_log_probs, rollout_log_probs, loss_masks, mode: str, low: float, high: float
):
    """The two upstream built-ins: r = exp(train − rollout) per token, w of ``mode`` on [low, high], pg · w.

    Masks pass through unchanged (IcePop zeroes the weight instead); metrics tis = r, tis_clipfrac = 1[w ≠ r],
    tis_abs = |r − 1|."""
    valid = valid_positions([t.numel() for t in train_log_probs])
    mask = _padded(loss_masks, valid) != 0
    ratio = level_ratio(_padded(train_log_probs, valid) - _padded(rollout_log_probs, valid), mask, "token")
    weights, _ = bounded_weights(ratio, mode, low, high)
    ratio, weights = _per_token(ratio, valid), _per_token(weights, valid)
    metrics = {"tis": ratio, "tis_clipfrac": (weights != ratio).float(), "tis_abs": (ratio - 1.0).abs()}
    return pg_loss * weights.to(pg_loss.dtype), loss_masks, metrics


def vanilla_tis_function(
    args, *, pg_loss: torch.Tensor, train_log_probs: list[torch.Tensor], rollout_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor], **kwargs: Any,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    """Upstream's truncated IS: w = clamp(exp(train − rollout), tis_clip_low, tis_clip) per token, pg_loss · w."""
    return bounded_token_ratio(pg_loss, train_log_probs, rollout_log_probs, loss_masks, "clip",
                               args.tis_clip_low, args.tis_clip)


def icepop_function(
    args, *, pg_loss: torch.Tensor, train_log_probs: list[torch.Tensor], rollout_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor], **kwargs: Any,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    """Upstream's IcePop: w = r where tis_clip_low ≤ r ≤ tis_clip, else 0 (r = exp(train − rollout)); pg · w."""
    return bounded_token_ratio(pg_loss, train_log_probs, rollout_log_probs, loss_masks, "mask",
                               args.tis_clip_low, args.tis_clip)


def tis_choice(args) -> TISChoice:
    """The built-in TIS's scalars, read once from the flags' names."""
    return TISChoice(mode=args.tis_mode, level=args.tis_level, low=args.tis_clip_low, high=args.tis_clip,
                     rs_level=args.rs_level, rs_low=args.rs_lower_bound, rs_high=args.rs_upper_bound,
                     veto_threshold=args.rs_veto_threshold)


def builtin_tis_choice(args) -> TISChoice | None:
    """The built-in TIS whose drop fractions the mismatch report shows; None when a hook replaces it."""
    return None if args.custom_tis_function_path else tis_choice(args)


def configured_tis_function(
    args, *, pg_loss: torch.Tensor, train_log_probs: list[torch.Tensor], rollout_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor], **kwargs: Any,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    """The built-in of --tis-mode / --tis-level / --rs-level / --rs-veto-threshold (``tis.tis_weights``).

    Returns pg_loss · w, the masks with the rejected tokens set to 0, and per-token metrics: tis = r (the level's
    ratio before the bound), tis_clipfrac = 1[w ≠ r], tis_abs = |r − 1|, tis_masked_fraction = 1[rejected]."""
    valid = valid_positions([t.numel() for t in train_log_probs])
    mask = _padded(loss_masks, valid) != 0
    result = tis_weights(_padded(train_log_probs, valid) - _padded(rollout_log_probs, valid), mask, tis_choice(args))
    ratio, weights = _per_token(result.ratio, valid), _per_token(result.weights, valid)
    keep = _per_token(result.keep, valid)
    metrics = {"tis": ratio, "tis_clipfrac": (weights != ratio).float(), "tis_abs": (ratio - 1.0).abs(),
               "tis_masked_fraction": (~keep).float()}
    kept_masks = list(torch.split(keep.to(loss_masks[0].dtype if loss_masks else torch.float32),
                                  [t.numel() for t in train_log_probs]))
    return pg_loss * weights.to(pg_loss.dtype), [m * k for m, k in zip(loss_masks, kept_masks, strict=True)], metrics


def load_weight_function(path: str):
    """The weight function a corrections row names (``package.module.function``, its ``weights``), or the
    ``--custom-tis-function-path`` that replaces it (checked at startup). A bad path is a ``MilesConfigError``."""
    return load_function("--custom-tis-function-path", path, f"{BUILTIN_PREFIX}.icepop_function")
