"""The torch rollout engine: batched sampling from a Hugging Face causal LM with a KV cache, on CPU, in fp32.

For each sampled token it returns log softmax(logits / temperature)[token], the definition the trainer uses for
its own log-probs, so a full forward pass of the same weights over prompt + response reproduces them to ~1e-6.
Under ``--rollout-top-k/-top-p/-min-p`` it returns the log-prob of the renormalized distribution it sampled from
and the kept ids per token, under which the trainer recomputes (``miles.rollout.sampling``, docs/sampling.md).
Departures from ``model.generate`` (on purpose): no implicit top-k (HF's default top_k=50 would make the rollout
log-probs disagree with the trainer's), temperature applied once to the logits that are both sampled from and
scored, and prompts left-padded with an explicit attention mask and position ids.

A plain class; the Ray layer makes it an actor. One engine pins its process to ``num_threads`` torch threads.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from miles.guard.divergence import check_finite_sampling
from miles.guard.fingerprint import weights_fingerprint
from miles.models.hf import load_causal_lm, load_tokenizer
from miles.rollout.prompt_tokens import check_positions, encode_prompts
from miles.rollout.sampling import (
    WHOLE_SOFTMAX,
    SamplingOptions,
    kept_ids_per_row,
    kept_tokens,
    renormalized_log_probs,
)
from miles.utils.errors import MilesConfigError
from miles.utils.types import Sample, SampleStatus


class GeneratedRow(NamedTuple):
    """One generated response: its tokens, their behavior log-probs, the kept ids per token (truncated sampling
    with truncated log-probs, else None), and whether a stop token or string ended it (else the length did)."""

    tokens: list[int]
    log_probs: list[float]
    kept_ids: list[list[int]] | None
    stopped: bool


Generated = list[GeneratedRow]


class TorchRolloutEngine:
    """The embedded default's engine (``--rollout-backend torch``): a KV-cached sampling loop over the Hugging Face
    model, fp32. Implements ``miles.rollout.protocol.RolloutEngine``."""

    waits_for_start = False  # it loads in about a second, beside the train processes

    @classmethod
    def preflight(cls, args) -> None:
        """Nothing of its own to check: the model folder is checked for every backend."""

    @classmethod
    def check_prompt_capacity(cls, args, prompt_ids: list[list[int]]) -> None:
        """Nothing to add: ``encode_prompts`` already fits each prompt and its response to the model's positions."""

    @classmethod
    def init_args(cls, args, index: int) -> tuple:
        return (args.hf_checkpoint, args.rollout_seed, 1)  # every engine's seed is its rollout_seed

    def __init__(self, hf_checkpoint: str, seed: int, num_threads: int = 1):
        """Load ``hf_checkpoint`` (fp32, eval mode) and its tokenizer; weight version 0 is the folder's weights.

        ``seed`` is the engine's base seed: ``generate(seed=s)`` samples from a generator seeded by (seed, s).
        """
        if not isinstance(num_threads, int) or num_threads < 1:
            raise MilesConfigError(f"num_threads={num_threads!r}: the engine needs at least one torch thread.")
        torch.set_num_threads(num_threads)
        self.seed = seed
        self.name, self.model_path = "torch rollout engine", hf_checkpoint
        self.model = load_causal_lm(hf_checkpoint)
        self.tokenizer = load_tokenizer(hf_checkpoint)
        self.eos_token_id = eos_token_id_of(self.tokenizer, self.model.config, hf_checkpoint)
        self.eos_token_ids = eos_token_ids_of(self.eos_token_id, hf_checkpoint)
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.eos_token_id  # padded positions are masked out
        self.weight_version = 0
        self.weight_fingerprint = weights_fingerprint(self.model)

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> str:
        """Load a full state dict (as from the trainer's ``model.state_dict()``), record ``version`` and return
        the fingerprint of the weights now in the model (not of the dict that was sent)."""
        try:
            self.model.load_state_dict(state_dict, strict=True)
        except RuntimeError as exc:
            raise RuntimeError(
                f"rollout engine: weight version {version} does not fit the engine's model (loaded from "
                f"{self.model.name_or_path}); the trainer must push the state dict of the same architecture.\n{exc}"
            ) from exc
        self.weight_version = version
        self.weight_fingerprint = weights_fingerprint(self.model)
        return self.weight_fingerprint

    def ready(self) -> str:
        return type(self).__name__

    def push_perf(self) -> dict[str, float]:
        return {}  # loading a state dict has no cost of its own to report beside the manager's perf/last_push_s

    def load_pushed(self, payload: dict) -> tuple[int, str, str]:
        """Load a trainer's push ``{"version", "fingerprint", "state_dict"}`` (``PolicyTrainer.export_weights``);
        return its version, the fingerprint the trainer sent, and that of the weights now loaded, for the
        RolloutManager to compare."""
        return payload["version"], payload["fingerprint"], self.load_weights(payload["state_dict"], payload["version"])

    def generate(
        self,
        prompts: list[dict],
        n_samples_per_prompt: int,
        temperature: float,
        max_response_len: int,
        seed: int,
        sampling: dict | None = None,
    ) -> list[Sample]:
        """Sample ``n_samples_per_prompt`` responses for each ``{"prompt": str, "label": str}``, in prompt order
        (the samples of prompt i are contiguous, ``group_index`` i), reproducibly for the same seeds and weights.
        ``sampling``: the ``SamplingOptions`` fields (top-p, top-k, min-p, stops, log-prob mode) as a plain dict.

        A response stops after a stop token (every eos id of the model, and ``stop_token_ids``) or a stop string,
        included (COMPLETED), or after ``max_response_len`` tokens (TRUNCATED).
        """
        check_generate_args(prompts, n_samples_per_prompt, temperature, max_response_len)
        prompt_ids = self.encode_texts([item["prompt"] for item in prompts], max_response_len)
        generated, versions = self.generate_rows(prompt_ids, n_samples_per_prompt, temperature, max_response_len,
                                                 seed, sampling)
        rows = [ids for ids in prompt_ids for _ in range(n_samples_per_prompt)]
        return [
            build_sample(self.tokenizer, prompts[index // n_samples_per_prompt], index, n_samples_per_prompt,
                         row_versions, self.weight_fingerprint, prompt_tokens, row)
            for index, (prompt_tokens, row, row_versions) in enumerate(zip(rows, generated, versions, strict=True))
        ]

    def generate_rows(self, prompt_ids: list[list[int]], n_samples_per_prompt: int, temperature: float,
                      max_new_tokens: int, seed: int, sampling: dict | None = None,
                      row_seeds: list[int] | None = None) -> tuple[Generated, list[list[int]]]:
        """``n_samples_per_prompt`` generated rows per tokenized prompt, and each row's weight version(s) (both
        engines' one step, for ``generate`` and for the HTTP server). ``row_seeds``: one seed per row (the
        server's batch of requests, each with its own ``sampling_seed``), each row drawn from its own generator;
        else every row from one generator seeded by ``seed``."""
        check_generate_args([{}], n_samples_per_prompt, temperature, max_new_tokens)
        options = sampling_options(sampling, self.model.config.vocab_size)
        check_positions(prompt_ids, max_new_tokens, getattr(self.model.config, "max_position_embeddings", None))
        check_token_ids(prompt_ids, self.model.config.vocab_size)
        version_at_start = self.weight_version
        generator = (torch.Generator().manual_seed(mix_seeds(self.seed, seed)) if row_seeds is None
                     else [torch.Generator().manual_seed(mix_seeds(self.seed, row_seed)) for row_seed in row_seeds])
        with torch.inference_mode():
            generated = sample_with_kv_cache(
                self.model,
                prompt_ids,
                n_samples_per_prompt,
                self.pad_token_id,
                self.eos_token_ids | set(options.stop_token_ids),
                temperature,
                max_new_tokens,
                generator,
                options,
                lambda tokens: self.tokenizer.decode(tokens, skip_special_tokens=True),
            )
        # Both versions, should a weight load ever land mid-generation: the runtime guard then refuses the samples.
        versions = sorted({version_at_start, self.weight_version})
        return generated, [versions] * len(generated)

    def encode_texts(self, texts: list[str], max_response_len: int) -> list[list[int]]:
        """Each prompt's token ids, checked to fit the model's positions with ``max_response_len`` new tokens."""
        max_positions = getattr(self.model.config, "max_position_embeddings", None)
        return encode_prompts(self.tokenizer, texts, max_positions, max_response_len, lambda i: f"prompt {texts[i]!r}")


def build_sample(
    tokenizer,
    item: dict,
    index: int,
    n_samples_per_prompt: int,
    weight_versions: list[int],
    weight_fingerprint: float | None,
    prompt_tokens: list[int],
    row: GeneratedRow,
) -> Sample:
    """One rollout sample of prompt ``item`` (every engine builds its samples here): COMPLETED if a stop token or
    string ended the response, else TRUNCATED; the loss mask covers every response token, the stop included."""
    tokens = row.tokens
    return Sample(
        group_index=index // n_samples_per_prompt,
        index=index,
        prompt=item["prompt"],
        label=item.get("label", ""),
        tokens=prompt_tokens + tokens,
        response_length=len(tokens),
        response=tokenizer.decode(tokens, skip_special_tokens=True),
        loss_mask=[1] * len(tokens),  # the stop included: it is an action the policy took
        rollout_log_probs=row.log_probs,
        weight_versions=weight_versions,
        weight_fingerprint=weight_fingerprint,
        status=SampleStatus.COMPLETED if row.stopped else SampleStatus.TRUNCATED,
        sampling_kept_ids=row.kept_ids,
    )


def sample_with_kv_cache(
    model: torch.nn.Module,
    prompt_rows: list[list[int]],
    n_samples_per_prompt: int,
    pad_token_id: int,
    stop_token_ids: set[int],
    temperature: float,
    max_new_tokens: int,
    generator: torch.Generator | list[torch.Generator],
    options: SamplingOptions = WHOLE_SOFTMAX,
    decode: Callable[[list[int]], str] | None = None,
) -> Generated:
    """Sample ``n_samples_per_prompt`` rows per prompt (row i belongs to prompt i // n) until a stop token, a stop
    string (``options.stop``, matched in ``decode(tokens)``) or ``max_new_tokens``.

    Per step t: lp_t = log_softmax(logits_t / temperature) (B, V). Whole softmax: token_t ~ Categorical(exp(lp_t)),
    its log-prob lp_t[token_t]. Truncated (``options.truncates``): K_t = kept_tokens(lp_t), q_t = lp_t renormalized
    over K_t, token_t ~ Categorical(exp(q_t)), its log-prob q_t[token_t] (or lp_t[token_t] with
    ``options.logprobs == "full"``), and K_t's ids are kept per row. Each prompt is prefilled once and its KV cache
    repeated n times. Prompts are left-padded; padded positions get attention mask 0 and position ids count only
    real tokens, so every row sees exactly what it would see alone. A finished row keeps being fed (its outputs are
    dropped) so the batch stays rectangular; the loop ends when every row has finished.
    """
    cache_kwarg = _cache_kwarg_name(model)
    logits, cache, attention_mask, next_positions = _prefill(model, prompt_rows, n_samples_per_prompt, pad_token_id)
    batch = logits.shape[0]
    lengths = torch.full((batch,), max_new_tokens, dtype=torch.long)  # (B,) response length once a row stopped
    stopped = torch.zeros(batch, dtype=torch.bool)  # (B,) ended by a stop token or string (COMPLETED)
    stop_ids = torch.tensor(sorted(stop_token_ids), dtype=torch.long)
    step_tokens, step_log_probs, step_kept = [], [], []
    for step in range(max_new_tokens):
        log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, V)
        check_finite_sampling(bool(torch.isfinite(log_probs).all()))  # diverged weights: one line, not multinomial's
        tokens, reported, kept_ids = _sample_step(log_probs, options, generator)  # (B, 1), (B,), per row or None
        step_tokens.append(tokens.squeeze(1))
        step_log_probs.append(reported)
        step_kept.append(kept_ids)
        ends = torch.isin(tokens.squeeze(1), stop_ids)
        if options.stop and decode is not None:
            so_far = torch.stack(step_tokens, dim=1).tolist()
            ends |= torch.tensor([any(text in decode(row) for text in options.stop) for row in so_far])
        newly = ends & ~stopped
        lengths[newly], stopped = step + 1, stopped | ends
        if bool(stopped.all()) or step == max_new_tokens - 1:
            break
        attention_mask = torch.cat([attention_mask, torch.ones_like(tokens)], dim=1)  # (B, P + step + 1)
        out = model(
            input_ids=tokens,
            attention_mask=attention_mask,
            position_ids=next_positions,
            use_cache=True,
            **{cache_kwarg: cache},
        )
        logits, cache = out.logits[:, -1, :], _cache_of(out)
        next_positions = next_positions + 1
    return _cut(torch.stack(step_tokens, dim=1), torch.stack(step_log_probs, dim=1), step_kept, lengths, stopped,
                options.truncates and options.logprobs == "truncated")


def _sample_step(log_probs: torch.Tensor, options: SamplingOptions, generator):
    """One token per row from log_probs (B, V): (tokens (B, 1), their reported log-probs (B,), kept ids per row or
    None). Whole softmax: the tokens are drawn from exp(log_probs) exactly as before truncation existed."""
    if not options.truncates:
        tokens = _draw(log_probs.exp(), generator)
        return tokens, log_probs.gather(1, tokens).squeeze(1), None
    kept = kept_tokens(log_probs, options.top_p, options.top_k, options.min_p)  # (B, V)
    sampled_from = renormalized_log_probs(log_probs, kept)  # (B, V)
    tokens = _draw(sampled_from.exp(), generator)
    reported = log_probs if options.logprobs == "full" else sampled_from
    return tokens, reported.gather(1, tokens).squeeze(1), kept_ids_per_row(kept)


def _draw(probs: torch.Tensor, generator) -> torch.Tensor:
    """One token per row of probs (B, V) -> (B, 1): from one generator, or row i from ``generator[i]`` (so a row's
    draw does not depend on the rows batched with it)."""
    if isinstance(generator, torch.Generator):
        return torch.multinomial(probs, num_samples=1, generator=generator)
    return torch.cat([torch.multinomial(probs[row:row + 1], num_samples=1, generator=own)
                      for row, own in enumerate(generator)])


def _prefill(
    model: torch.nn.Module, prompt_rows: list[list[int]], repeats: int, pad_token_id: int
) -> tuple[torch.Tensor, object, torch.Tensor, torch.Tensor]:
    """One forward pass over the distinct prompts, then every output repeated ``repeats`` times along the batch
    (n samples of a prompt share its prefix: with 8 samples this makes the prefill ~4x cheaper).

    Returns the last position's logits (B, V), the KV cache, the attention mask (B, P) and the next position
    ids (B, 1), with B = len(prompt_rows) * repeats.
    """
    input_ids, attention_mask = left_pad(prompt_rows, pad_token_id)  # (P_rows, P) each
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)  # (P_rows, P)
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True, logits_to_keep=1
    )
    cache = _cache_of(out)
    cache.batch_repeat_interleave(repeats)  # in place: row i of the batch is prompt i // repeats
    return (
        out.logits[:, -1, :].repeat_interleave(repeats, dim=0),
        cache,
        attention_mask.repeat_interleave(repeats, dim=0),
        position_ids[:, -1:].repeat_interleave(repeats, dim=0) + 1,
    )


def _cache_kwarg_name(model: torch.nn.Module) -> str:
    """transformers renamed ``past_key_values`` to ``cache`` during 5.x; use whichever this model takes."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cache_of(out) -> object:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def left_pad(rows: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token rows to one length: returns input ids and attention mask (1 = real token), each (B, P)."""
    width = max(len(row) for row in rows)
    input_ids = torch.tensor([[pad_token_id] * (width - len(row)) + row for row in rows], dtype=torch.long)  # (B, P)
    attention_mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows], dtype=torch.long)
    return input_ids, attention_mask


def _cut(tokens: torch.Tensor, log_probs: torch.Tensor, step_kept: list[list[list[int]]], lengths: torch.Tensor,
         stopped: torch.Tensor, with_kept: bool) -> Generated:
    """Each row up to and including the token that stopped it; tokens and log_probs are (B, T), step_kept[t][row]."""
    rows = []
    for row, (token_row, log_prob_row) in enumerate(zip(tokens.tolist(), log_probs.tolist(), strict=True)):
        length = int(lengths[row])
        kept = [step_kept[t][row] for t in range(length)] if with_kept else None
        rows.append(GeneratedRow(token_row[:length], log_prob_row[:length], kept, bool(stopped[row])))
    return rows


def mix_seeds(engine_seed: int, call_seed: int) -> int:
    """A 63-bit generator seed from (engine seed, call seed), stable across processes and Python versions."""
    digest = hashlib.sha256(f"{engine_seed}:{call_seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def check_generate_args(prompts: list[dict], n_samples_per_prompt: int, temperature: float, max_response_len: int):
    if isinstance(max_response_len, bool) or not isinstance(max_response_len, int) or max_response_len < 1:
        raise MilesConfigError(
            f"--rollout-max-response-len={max_response_len!r}: a response needs a budget of at least 1 token; "
            f"pass a positive integer (the embedded task needs 3)."
        )
    if isinstance(n_samples_per_prompt, bool) or not isinstance(n_samples_per_prompt, int) or n_samples_per_prompt < 1:
        raise MilesConfigError(
            f"--n-samples-per-prompt={n_samples_per_prompt!r}: must be a positive integer; pass 1 or more."
        )
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise MilesConfigError(
            f"--rollout-temperature={temperature!r}: must be a finite number > 0 (log-probs are taken under "
            f"logits / temperature); pass e.g. 1.0."
        )
    if not prompts:
        raise MilesConfigError("generate() got no prompts; pass at least one {'prompt': ..., 'label': ...} item.")


def check_token_ids(prompt_ids: list[list[int]], vocab_size: int) -> None:
    """Every prompt token is an id of the vocabulary (a request's input_ids come from outside)."""
    outside = sorted({token for row in prompt_ids for token in row if not 0 <= token < vocab_size})
    if outside:
        raise MilesConfigError(f"prompt token ids {outside[:10]} are outside the model's vocabulary (ids 0.."
                               f"{vocab_size - 1}); tokenize with the model's tokenizer.")


def eos_token_id_of(tokenizer, config, hf_checkpoint: str) -> int:
    """The tokenizer's eos token, else config.json's (the first of a list)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        eos = config.eos_token_id
        eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    if eos is None:
        raise MilesConfigError(
            f"--hf-checkpoint {hf_checkpoint!r}: neither the tokenizer nor config.json defines an eos token, so "
            f"responses could never complete. Set eos_token in the tokenizer (or eos_token_id in config.json)."
        )
    return int(eos)


def eos_token_ids_of(eos_token_id: int, hf_checkpoint: str) -> set[int]:
    """Every eos id SGLang stops on: the tokenizer's, plus generation_config.json's (an int or a list), so both
    engines stop on the same set (docs/sampling.md)."""
    from transformers import GenerationConfig

    try:
        extra = GenerationConfig.from_pretrained(hf_checkpoint).eos_token_id
    except OSError:  # no generation_config.json
        extra = None
    extra = [] if extra is None else [extra] if isinstance(extra, int) else list(extra)
    return {eos_token_id, *map(int, extra)}


def sampling_options(sampling: dict | None, vocab_size: int) -> SamplingOptions:
    """The engine's ``SamplingOptions`` from the manager's plain dict; a stop id outside the vocabulary is refused."""
    options = SamplingOptions(**{key: tuple(value) if isinstance(value, list) else value
                                 for key, value in (sampling or {}).items()})
    outside = [token for token in options.stop_token_ids if not 0 <= token < vocab_size]
    if outside:
        raise MilesConfigError(f"--rollout-stop-token-ids {outside}: the model's vocabulary has ids 0..{vocab_size - 1}; "
                               "pass ids the tokenizer produces.")
    return options
