"""From a batch of samples to model inputs, and from model outputs back to per-response-token values.

Both backends pad the same way and read their outputs through these functions, so they agree by construction on
which position belongs to which token. The log-prob of response token t is log_softmax(logits / temperature) at
the position that predicts it (the position before it), the definition the rollout engine uses too
(docs/embedded_default.md). The critic's value V_t for response token t is read at that same position (docs/design.md
§7).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from miles.rollout.sampling import kept_mask
from miles.utils.types import Sample


def pad_right(samples: list[Sample], pad_token_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad prompt+response tokens: input_ids (B, T) and attention_mask (B, T)."""
    max_len = max(len(sample.tokens) for sample in samples)
    input_ids = torch.full((len(samples), max_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(samples), max_len), dtype=torch.long)
    for row, sample in enumerate(samples):
        input_ids[row, : len(sample.tokens)] = torch.tensor(sample.tokens)
        attention_mask[row, : len(sample.tokens)] = 1
    return input_ids, attention_mask


def response_slices(samples: list[Sample]) -> list[slice]:
    """Positions whose outputs predict each sample's response tokens: [prompt_len - 1, len - 1)."""
    return [slice(sample.prompt_length - 1, len(sample.tokens) - 1) for sample in samples]


def gather_response_log_probs(
    logits: torch.Tensor, input_ids: torch.Tensor, samples: list[Sample], temperature: float, with_entropy: bool,
    chunk_size: int | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Per-sample log-probs (and entropies) of the response tokens from full-vocabulary logits (B, T, V).

    log_prob_t = log_softmax(logits_{t-1} / temperature)[token_t]; entropy_t = -sum p log p of that distribution.
    A sample drawn by a truncated sampler (``sample.sampling_kept_ids``) is scored under the engine's kept set:
    log_softmax over the kept tokens only, -inf outside (``miles.rollout.sampling``), so the recomputed log-probs
    are those of the distribution the engine sampled from, for the old, the current and the reference policy.
    ``chunk_size`` (--log-probs-chunk-size): the log-softmax runs over that many tokens at a time, so its
    (tokens, V) intermediates stay that small; each token's row is the same computation either way.
    """
    log_probs, entropies = [], []
    for row, (sample, span) in enumerate(zip(samples, response_slices(samples), strict=True)):
        targets = input_ids[row, span.start + 1 : span.stop + 1]  # (R,)
        length = max(targets.numel(), 1)  # an empty response: one empty part
        step, kept = chunk_size or length, sample.sampling_kept_ids
        parts = [_token_log_probs(logits[row, span][start : start + step], targets[start : start + step],
                                  None if kept is None else kept[start : start + step], temperature, with_entropy)
                 for start in range(0, length, step)]
        log_probs.append(torch.cat([part[0] for part in parts]))
        if with_entropy:
            entropies.append(torch.cat([part[1] for part in parts]))
    return log_probs, (entropies if with_entropy else None)


def _token_log_probs(logits: torch.Tensor, targets: torch.Tensor, kept_ids: list[list[int]] | None,
                     temperature: float, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs, entropies or None) of ``targets`` (R,) under ``logits`` (R, V) of R response positions, scored
    under the engine's kept set of each position when it sampled from one (``kept_ids``)."""
    scaled = logits.float() / temperature  # (R, V)
    if kept_ids is not None:
        scaled = scaled.masked_fill(~kept_mask(kept_ids, scaled.shape[-1]), float("-inf"))
    token_log_probs = F.log_softmax(scaled, dim=-1)  # (R, V)
    log_probs = token_log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return log_probs, None
    # outside a kept set p = 0 and log p = -inf: the clamp makes those terms 0 * finite = 0, not nan
    finite_log_probs = token_log_probs.clamp(min=torch.finfo(token_log_probs.dtype).min)
    return log_probs, -(token_log_probs.exp() * finite_log_probs).sum(-1)


def gather_response_values(scores: torch.Tensor, samples: list[Sample]) -> list[torch.Tensor]:
    """Per-sample critic values V_t (1-D, response_length) from per-position scores (B, T)."""
    return [scores[row, span].float() for row, span in enumerate(response_slices(samples))]
