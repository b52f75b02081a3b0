"""The torch rollout engine: batched sampling from a Hugging Face causal LM with a KV cache, on CPU, in fp32.

For each sampled token it returns log softmax(logits / temperature)[token], the definition the trainer uses for
its own log-probs, so a full forward pass of the same weights over prompt + response reproduces them to ~1e-6.
Departures from ``model.generate`` (on purpose): no top-k / top-p (HF's default top_k=50 would make the
rollout log-probs disagree with the trainer's), temperature applied once to the logits that are both sampled
from and scored, and prompts left-padded with an explicit attention mask and position ids.

A plain class; the Ray layer makes it an actor. One engine pins its process to ``num_threads`` torch threads.
"""

from __future__ import annotations

import hashlib
import inspect
import math

import torch

from miles.guard.divergence import check_finite_sampling
from miles.guard.fingerprint import weights_fingerprint
from miles.models.hf import load_causal_lm, load_tokenizer
from miles.rollout.prompt_tokens import encode_prompts
from miles.utils.errors import MilesConfigError
from miles.utils.types import Sample, SampleStatus


class TorchRolloutEngine:
    def __init__(self, hf_checkpoint: str, seed: int, num_threads: int = 1):
        """Load ``hf_checkpoint`` (fp32, eval mode) and its tokenizer; weight version 0 is the folder's weights.

        ``seed`` is the engine's base seed: ``generate(seed=s)`` samples from a generator seeded by (seed, s).
        """
        if not isinstance(num_threads, int) or num_threads < 1:
            raise MilesConfigError(f"num_threads={num_threads!r}: the engine needs at least one torch thread.")
        torch.set_num_threads(num_threads)
        self.seed = seed
        self.model = load_causal_lm(hf_checkpoint)
        self.tokenizer = load_tokenizer(hf_checkpoint)
        self.eos_token_id = eos_token_id_of(self.tokenizer, self.model.config, hf_checkpoint)
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
    ) -> list[Sample]:
        """Sample ``n_samples_per_prompt`` responses for each ``{"prompt": str, "label": str}``, in prompt order
        (the samples of prompt i are contiguous, ``group_index`` i), reproducibly for the same seeds and weights.

        A response stops after ``<eos>`` (included, COMPLETED) or after ``max_response_len`` tokens (TRUNCATED).
        """
        check_generate_args(prompts, n_samples_per_prompt, temperature, max_response_len)
        prompt_ids = self._encode_prompts(prompts, max_response_len)
        version_at_start = self.weight_version
        generator = torch.Generator().manual_seed(mix_seeds(self.seed, seed))
        with torch.inference_mode():
            response_ids, response_log_probs = sample_with_kv_cache(
                self.model,
                prompt_ids,
                n_samples_per_prompt,
                self.pad_token_id,
                self.eos_token_id,
                temperature,
                max_response_len,
                generator,
            )
        # Both versions, should a weight load ever land mid-generation: the runtime guard then refuses the samples.
        versions = sorted({version_at_start, self.weight_version})
        rows = [ids for ids in prompt_ids for _ in range(n_samples_per_prompt)]
        return [
            build_sample(self.tokenizer, self.eos_token_id, prompts[index // n_samples_per_prompt], index,
                         n_samples_per_prompt, versions, self.weight_fingerprint, *row)
            for index, row in enumerate(zip(rows, response_ids, response_log_probs, strict=True))
        ]

    def _encode_prompts(self, prompts: list[dict], max_response_len: int) -> list[list[int]]:
        texts = [item["prompt"] for item in prompts]
        max_positions = getattr(self.model.config, "max_position_embeddings", None)
        return encode_prompts(self.tokenizer, texts, max_positions, max_response_len, lambda i: f"prompt {texts[i]!r}")

def build_sample(
    tokenizer,
    eos_token_id: int,
    item: dict,
    index: int,
    n_samples_per_prompt: int,
    weight_versions: list[int],
    weight_fingerprint: float | None,
    prompt_tokens: list[int],
    tokens: list[int],
    log_probs: list[float],
) -> Sample:
    """One rollout sample of prompt ``item`` (every engine builds its samples here): COMPLETED if the response ends
    with ``<eos>``, else TRUNCATED; the loss mask covers every response token, ``<eos>`` included."""
    completed = bool(tokens) and tokens[-1] == eos_token_id
    return Sample(
        group_index=index // n_samples_per_prompt,
        index=index,
        prompt=item["prompt"],
        label=item.get("label", ""),
        tokens=prompt_tokens + tokens,
        response_length=len(tokens),
        response=tokenizer.decode(tokens, skip_special_tokens=True),
        loss_mask=[1] * len(tokens),  # <eos> included: it is an action the policy took
        rollout_log_probs=log_probs,
        weight_versions=weight_versions,
        weight_fingerprint=weight_fingerprint,
        status=SampleStatus.COMPLETED if completed else SampleStatus.TRUNCATED,
    )


def sample_with_kv_cache(
    model: torch.nn.Module,
    prompt_rows: list[list[int]],
    n_samples_per_prompt: int,
    pad_token_id: int,
    eos_token_id: int,
    temperature: float,
    max_new_tokens: int,
    generator: torch.Generator,
) -> tuple[list[list[int]], list[list[float]]]:
    """Sample ``n_samples_per_prompt`` rows per prompt (row i belongs to prompt i // n) until ``<eos>`` or
    ``max_new_tokens``; return each row's tokens and their log-probs.

    Per step t: lp_t = log_softmax(logits_t / temperature) (B, V); token_t ~ Categorical(exp(lp_t)); the log-prob
    of token_t is lp_t[token_t]. Each prompt is prefilled once and its KV cache repeated n times. Prompts are
    left-padded; padded positions get attention mask 0 and position ids count only real tokens, so every row
    sees exactly what it would see alone. A finished row keeps being fed (its outputs are dropped) so the batch
    stays rectangular; the loop ends when every row has finished.
    """
    cache_kwarg = _cache_kwarg_name(model)
    logits, cache, attention_mask, next_positions = _prefill(model, prompt_rows, n_samples_per_prompt, pad_token_id)
    finished = torch.zeros(logits.shape[0], dtype=torch.bool)  # (B,)
    step_tokens, step_log_probs = [], []
    for step in range(max_new_tokens):
        log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, V)
        check_finite_sampling(bool(torch.isfinite(log_probs).all()))  # diverged weights: one line, not multinomial's
        tokens = torch.multinomial(log_probs.exp(), num_samples=1, generator=generator)  # (B, 1)
        step_tokens.append(tokens.squeeze(1))
        step_log_probs.append(log_probs.gather(1, tokens).squeeze(1))
        finished |= tokens.squeeze(1) == eos_token_id
        if bool(finished.all()) or step == max_new_tokens - 1:
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
    return _cut_at_eos(torch.stack(step_tokens, dim=1), torch.stack(step_log_probs, dim=1), eos_token_id)


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


def _cut_at_eos(
    tokens: torch.Tensor, log_probs: torch.Tensor, eos_token_id: int
) -> tuple[list[list[int]], list[list[float]]]:
    """Keep each row up to and including its first ``<eos>``; tokens and log_probs are (B, T)."""
    token_rows, log_prob_rows = tokens.tolist(), log_probs.tolist()
    for i, row in enumerate(token_rows):
        if eos_token_id in row:
            length = row.index(eos_token_id) + 1
            token_rows[i], log_prob_rows[i] = row[:length], log_prob_rows[i][:length]
    return token_rows, log_prob_rows


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
