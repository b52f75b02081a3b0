"""Truncated sampling (top-k, top-p, min-p) and the log-probs of the distribution a token was actually drawn from.

Pure functions on tensors, shared by the engines (which pick the kept set and sample from it) and the trainer (which
recomputes its log-probs under the kept set the engine used). The rule is SGLang's
(``sglang.srt.layers.sampler.top_k_top_p_min_p_sampling_from_probs_torch``), so both engines truncate alike:

    sort p = softmax(logits / T) descending (ties keep token order);  kept_i = rank_i < k               (top-k)
                                                                      and (sum_{j before i} p_j) <= top_p  (top-p)
                                                                      and p_i >= min_p * max_j p_j      (min-p)

The behavior log-prob is then that of the renormalized distribution over the kept set K:

    log q(token) = log p(token) - log sum_{j in K} p_j      (log_softmax of logits / T with -inf outside K)

Reporting log p(token) instead (what SGLang and vLLM return) makes the importance ratio pi/q wrong by the kept mass
(TRL #4159 measured a ratio of 2.0): ``--sampling-logprobs full`` keeps that upstream behavior reachable.

The kept set travels with the sample as the kept token ids of each response position (``Sample.sampling_kept_ids``):
at most k ids per position with top-k, the nucleus with top-p alone; a dense (T, vocab) mask would cost a whole
vocabulary per token (152k entries for Qwen), and recomputing the set in the trainer from its own logits would let a
tiny engine/trainer difference move a token in or out of the set (docs/sampling.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOGPROB_MODES = ("truncated", "full")


@dataclass(frozen=True)
class SamplingOptions:
    """What an engine samples with besides the temperature (``--rollout-top-p`` ...; ``--eval-*`` for evaluation).

    ``logprobs``: "truncated" reports log q (the distribution sampled from) and keeps the kept ids on the sample;
    "full" reports log p of the whole softmax and keeps no ids (upstream's behavior: biased under truncation).
    """

    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: str = "truncated"

    @property
    def truncates(self) -> bool:
        """True when a filter can drop a token (top-k 0 or -1 is off, as in upstream miles and SGLang)."""
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0


WHOLE_SOFTMAX = SamplingOptions()


def kept_tokens(log_probs: torch.Tensor, top_p: float, top_k: int, min_p: float) -> torch.Tensor:
    """The kept set (B, V) bool of tempered full log-probs (B, V) under SGLang's top-k, top-p, min-p rule."""
    probs = log_probs.exp()  # (B, V)
    probs_sorted, order = probs.sort(dim=-1, descending=True, stable=True)  # (B, V) each
    mass_before = probs_sorted.cumsum(dim=-1) - probs_sorted  # (B, V)
    keep_sorted = mass_before <= top_p
    if top_k > 0:
        keep_sorted[:, top_k:] = False
    if min_p > 0.0:
        keep_sorted &= probs_sorted >= min_p * probs_sorted[:, :1]
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def renormalized_log_probs(log_probs: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """log q = log_softmax over the kept set: log p - logsumexp(log p over K), -inf outside K; (B, V) in and out."""
    return torch.log_softmax(log_probs.masked_fill(~kept, float("-inf")), dim=-1)


def kept_ids_per_row(kept: torch.Tensor) -> list[list[int]]:
    """The kept token ids of each row of a (B, V) bool mask, ascending."""
    rows, ids = kept.nonzero(as_tuple=True)
    return [chunk.tolist() for chunk in ids.split(torch.bincount(rows, minlength=kept.shape[0]).tolist())]


def kept_mask(kept_ids: list[list[int]], vocab_size: int) -> torch.Tensor:
    """The (R, V) bool mask of kept token ids per position (the inverse of ``kept_ids_per_row``)."""
    mask = torch.zeros(len(kept_ids), vocab_size, dtype=torch.bool)
    rows = torch.tensor([row for row, ids in enumerate(kept_ids) for _ in ids], dtype=torch.long)
    cols = torch.tensor([token for ids in kept_ids for token in ids], dtype=torch.long)
    mask[rows, cols] = True
    return mask

