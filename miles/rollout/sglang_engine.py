"""The SGLang rollout engine (``--rollout-backend sglang``): SGLang's own HTTP server, one process per engine
(``miles.rollout.sglang_server``), driven by a Ray actor with the interface and the guarantees of the torch engine
(docs/sglang.md). The actor's own HTTP front (``miles.rollout.engine_server``) is what the router sends a generate
function's requests to: it answers them through this engine, so they get the same log-probs and records as miles'
own rollouts.

- Log-probs: SGLang's sampled-token log-probs are log softmax(logits / temperature)[token] (its sampler's standard
  path), the trainer's definition, as long as no penalty or ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is in play: every
  sampling parameter is passed explicitly, penalties at their neutral value, and the preflight refuses the
  environment variable (``miles.rollout.sglang_args``). Under top-k / top-p / min-p SGLang still returns that
  whole-softmax log-prob: the engine renormalizes it over the kept set, rebuilt from the top log-probs it asks for
  (``truncated_from_top``), and keeps the kept ids on the sample for the trainer (docs/sampling.md).
- Stops and truncation: SGLang's ``finish_reason``; a "length" shorter than asked is refused (SGLang capped it).
- One weight version per sample: the actor runs one call at a time (its lock also holds off the HTTP front's
  requests), so no push lands inside ``generate``; before each update the cache is flushed, polled until SGLang
  accepts (it refuses while requests are pending).
- The update goes through ``/update_weights_from_tensor`` between ``/begin_weight_update`` and
  ``/end_weight_update``, with the version, and every answer is checked: an update SGLang did not apply is an
  ``OffPolicyGuardError``, never a silent stale engine.
- The fingerprint: after each update SGLang's own weight checker (``/weights_checker``) hashes the tensors the server
  holds; the table must equal the one computed from the pushed tensors in SGLang's layout
  (``miles.rollout.sglang_layout``). Only then does the engine report the pushed weights' fingerprint as its own: it
  holds them bit for bit.
- Each sample's version is the one SGLang itself reports (``meta_info["weight_version"]``).
"""

from __future__ import annotations

import os
import time

import torch

from miles.guard.fingerprint import weights_fingerprint
from miles.models.hf import load_tokenizer
from miles.rollout import sglang_shims
from miles.rollout.engine import (
    GeneratedRow,
    build_sample,
    check_generate_args,
    check_token_ids,
    eos_token_id_of,
    mix_seeds,
    sampling_options,
)
from miles.rollout.sampling import SamplingOptions, kept_tokens, renormalized_log_probs
from miles.rollout.prompt_tokens import check_positions, encode_prompts
from miles.rollout.sglang_args import check_kv_capacity, check_sglang_server_args, engine_kwargs, max_request_tokens
from miles.rollout.sglang_layout import check_held_weights, sglang_digests
from miles.rollout.sglang_server import SGLangServerProcess
from miles.utils.errors import REPORT_BUG, OffPolicyGuardError, RolloutEngineError

FLUSH_TRIES = 200  # flush_cache polls, FLUSH_WAIT_S apart, before an update is refused (10 s)
FLUSH_WAIT_S = 0.05
# Neutral values of every sampling parameter that would change the log-prob definition (SGLang's model defaults,
# from generation_config.json, would otherwise apply to the ones left unset).
NEUTRAL_SAMPLING = {"top_k": -1, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0,
                    "presence_penalty": 0.0, "min_new_tokens": 0}


class SGLangRolloutEngine:
    """Implements ``miles.rollout.protocol.RolloutEngine``."""

    waits_for_start = True  # a start takes about 30 s here, and may fail: the run waits for it before training

    @classmethod
    def preflight(cls, args) -> None:
        """The ``--sglang-*`` words, checked with SGLang's own parser and kept as ``args.sglang_server_args``."""
        args.sglang_server_args = check_sglang_server_args(
            getattr(args, "sglang_words", []), args.hf_checkpoint, cuda=torch.cuda.is_available())

    @classmethod
    def check_prompt_capacity(cls, args, prompt_ids: list[list[int]]) -> None:
        """SGLang caps a request's new tokens at what its KV cache holds, without an error: refuse such prompts."""
        check_kv_capacity(prompt_ids, max(args.rollout_max_response_len, args.eval_max_response_len),
                          max_request_tokens(args.sglang_server_args, torch.cuda.is_available()))

    @classmethod
    def init_args(cls, args, index: int) -> tuple:
        stand_in_log = os.path.join(args.log_dir, "sglang_stand_ins.log")
        return (args.hf_checkpoint, args.rollout_seed + index, args.sglang_server_args, index, stand_in_log,
                args.rollout_engine_start_timeout)

    def __init__(self, hf_checkpoint: str, seed: int, server_args: dict, engine_index: int,
                 stand_in_log: str | None = None, start_timeout_s: float = 600.0):
        """Start SGLang's server on ``hf_checkpoint`` with miles' settings plus the user's ``--sglang-*``
        ``server_args`` (already checked by the preflight). A failed start is one ``RolloutEngineError`` line naming
        the engine."""
        self.name, self.model_path = f"SGLang rollout engine {engine_index}", hf_checkpoint
        sglang_shims.activate(stand_in_log)  # in this process's sys.path, which the server process inherits
        kwargs = engine_kwargs(hf_checkpoint, seed, server_args)
        self.server = SGLangServerProcess(kwargs, self.name, start_timeout_s)
        from transformers import AutoConfig

        self.config = AutoConfig.from_pretrained(hf_checkpoint)
        self.dtype = getattr(torch, kwargs["dtype"])
        self.tied_embeddings = bool(getattr(self.config, "tie_word_embeddings", False))
        self.tokenizer = load_tokenizer(hf_checkpoint)
        self.eos_token_id = eos_token_id_of(self.tokenizer, self.config, hf_checkpoint)
        self.max_request_tokens = max_request_tokens(kwargs, kwargs["device"] == "cuda")
        self.weight_version = 0
        self.weight_fingerprint = None  # version 0 (the folder's weights) is never trained on: the push comes first
        self.perf: dict[str, float] = {}

    def ready(self) -> str:
        """Returns once the engine started (the caller waits on it with a time-out)."""
        return self.name

    def held_digests(self) -> dict[str, str]:
        """SGLang's checksum of every tensor the engine holds, in its own layout (its weight checker)."""
        status, answer = self.server.call("/weights_checker", {"action": "checksum"})
        ranks = answer.get("ranks") if status == 200 else None
        if not ranks:
            raise RolloutEngineError(f"{self.name}: SGLang's weight checker failed: {answer.get('message')}")
        if len(ranks) != 1:
            raise RolloutEngineError(f"{self.name}: {len(ranks)} ranks report checksums; miles checks one rank "
                                     "per engine (--sglang-tp-size 1, the default)")
        return dict(ranks[0]["checksums"])

    def load_pushed(self, payload: dict) -> tuple[int, str, str]:
        """Load a trainer's push ``{"version", "fingerprint", "state_dict"}`` through SGLang's update path and return
        its version, the trainer's fingerprint, and the fingerprint of the weights the engine now holds (equal to
        the trainer's once SGLang's checksums of what it holds match the pushed tensors in SGLang's layout)."""
        version, state_dict = payload["version"], payload["state_dict"]
        start = time.perf_counter()
        self._flush_cache(version)
        self._call("begin_weight_update", version, self._post("/begin_weight_update"))
        try:
            updated = self._update_from_tensor(state_dict, version)
        finally:
            ended = self._post("/end_weight_update")  # the session is closed whatever the update did
        self._call("update_weights_from_tensor", version, updated)
        self._call("end_weight_update", version, ended)
        loaded = time.perf_counter()
        held = self.held_digests()
        checked = time.perf_counter()
        expected = sglang_digests(state_dict, self.dtype, self.tied_embeddings)
        check_held_weights(f"{self.name}, weight version {version}", expected, held)
        self.weight_version = version
        self.weight_fingerprint = weights_fingerprint(state_dict)  # the weights it holds, proved equal above
        self.perf = {"perf/sglang_update_s": loaded - start, "perf/sglang_checksum_s": checked - loaded,
                     "perf/sglang_expected_digests_s": time.perf_counter() - checked}
        return version, payload["fingerprint"], self.weight_fingerprint

    def push_perf(self) -> dict[str, float]:
        """The latest push's cost on this engine: SGLang's update, its checksum, the expected digests."""
        return dict(self.perf)

    def _post(self, path: str, body: dict | None = None) -> tuple[bool, str]:
        """(success, message) of one of SGLang's weight-update endpoints."""
        status, answer = self.server.call(path, body)
        return status == 200 and answer.get("success", True), str(answer.get("message", answer))

    def _update_from_tensor(self, state_dict: dict[str, torch.Tensor], version: int) -> tuple[bool, str]:
        """``/update_weights_from_tensor`` with the ``weight_version`` SGLang then stamps on every generation: the
        tensors travel as shared-memory handles (SGLang's serializer; the server process shares this actor's
        multiprocessing key), base64 in the JSON body."""
        from sglang.srt.utils.common import MultiprocessingSerializer

        named = [(name, tensor.detach().contiguous()) for name, tensor in state_dict.items()]
        return self._post("/update_weights_from_tensor", {
            "serialized_named_tensors": [MultiprocessingSerializer.serialize(named, output_str=True)],
            "flush_cache": True, "weight_version": str(version)})

    def _flush_cache(self, version: int) -> None:
        """Poll ``/flush_cache`` until SGLang accepts it: it refuses while requests are pending, and an update then
        could kill the scheduler (seen with an older SGLang)."""
        for _ in range(FLUSH_TRIES):
            if self.server.call("/flush_cache")[0] == 200:
                return
            time.sleep(FLUSH_WAIT_S)
        raise RolloutEngineError(f"{self.name}: the cache could not be flushed before weight version {version} in "
                                 f"{FLUSH_TRIES * FLUSH_WAIT_S:g} s (requests still pending)")

    def _call(self, what: str, version: int, result) -> None:
        success, message = result[0], result[1]
        if not success:
            raise OffPolicyGuardError(f"{self.name}: weight version {version} was not loaded: SGLang's {what} "
                                      f"returned {message!r}; the engine would keep generating with old weights. "
                                      f"{REPORT_BUG}")

    def generate(self, prompts: list[dict], n_samples_per_prompt: int, temperature: float, max_response_len: int,
                 seed: int, sampling: dict | None = None) -> list:
        """Sample ``n_samples_per_prompt`` responses per prompt, in prompt order (the torch engine's contract), with
        the same truncation, stops and behavior log-probs (``miles.rollout.sampling``). Each row gets its own
        ``sampling_seed`` from ``seed`` (the rollout's, from --rollout-seed): SGLang samples with it in its
        deterministic mode and from the engine's seeded generator otherwise (docs/sglang.md, "Seeds")."""
        check_generate_args(prompts, n_samples_per_prompt, temperature, max_response_len)
        prompt_ids = self.encode_texts([item["prompt"] for item in prompts], max_response_len)
        generated, versions = self.generate_rows(prompt_ids, n_samples_per_prompt, temperature, max_response_len,
                                                 seed, sampling)
        rows = [ids for ids in prompt_ids for _ in range(n_samples_per_prompt)]
        return [build_sample(self.tokenizer, prompts[index // n_samples_per_prompt], index, n_samples_per_prompt,
                             row_versions, self.weight_fingerprint, row, generated_row)
                for index, (row, generated_row, row_versions) in enumerate(zip(rows, generated, versions, strict=True))]

    def generate_rows(self, prompt_ids: list[list[int]], n_samples_per_prompt: int, temperature: float,
                      max_new_tokens: int, seed: int, sampling: dict | None = None,
                      row_seeds: list[int] | None = None) -> tuple[list[GeneratedRow], list[list[int]]]:
        """``n_samples_per_prompt`` generated rows per tokenized prompt, and the weight version SGLang stamped on
        each row, as a one-item list (both engines' one step, for ``generate`` and for the HTTP server). Row i's ``sampling_seed`` is
        mixed from ``row_seeds[i]`` when given (the server's batch of requests), else from (``seed``, i)."""
        check_generate_args([{}], n_samples_per_prompt, temperature, max_new_tokens)
        options = sampling_options(sampling, self.config.vocab_size)
        check_positions(prompt_ids, max_new_tokens, getattr(self.config, "max_position_embeddings", None))
        check_token_ids(prompt_ids, self.config.vocab_size)
        check_kv_capacity(prompt_ids, max_new_tokens, self.max_request_tokens)
        rows = [ids for ids in prompt_ids for _ in range(n_samples_per_prompt)]
        params = sampling_params(temperature, max_new_tokens, options)
        seeds = [mix_seeds(seed, row) for row in range(len(rows))] if row_seeds is None else [
            mix_seeds(row_seed, 0) for row_seed in row_seeds]
        per_row = [{**params, "sampling_seed": row_seed} for row_seed in seeds]
        status, outputs = self.server.call("/generate", {
            "input_ids": rows, "sampling_params": per_row, "return_logprob": True,
            "top_logprobs_num": top_logprobs_num(options, self.config.vocab_size) or 0})
        if status != 200:
            raise RolloutEngineError(f"{self.name}: SGLang's /generate answered HTTP {status}: {outputs}")
        answered = [self._response(output, options, max_new_tokens) for output in outputs]
        return [row for row, _ in answered], [[version] for _, version in answered]

    def encode_texts(self, texts: list[str], max_response_len: int) -> list[list[int]]:
        """Each prompt's token ids, checked to fit the model's positions (``generate_rows`` checks SGLang's KV cache,
        for these and for a request's own ids)."""
        return encode_prompts(self.tokenizer, texts, getattr(self.config, "max_position_embeddings", None),
                              max_response_len, lambda i: f"prompt {texts[i]!r}")

    def _response(self, output: dict, options: SamplingOptions, max_response_len: int) -> tuple[GeneratedRow, int]:
        """(the generated row, the weight version SGLang stamped) of one generation; it stopped if SGLang's
        ``finish_reason`` says a stop token or string ended it, else the length did, and then at the length asked
        for (a shorter one is SGLang capping the request: refused, never a silent truncation)."""
        tokens, meta = list(output["output_ids"]), output["meta_info"]
        entries = meta["output_token_logprobs"]  # (logprob, token_id, None) per generated token
        if [entry[1] for entry in entries] != tokens:
            raise RolloutEngineError(f"{self.name}: SGLang returned log-probs of tokens {[e[1] for e in entries]} "
                                     f"for the generated tokens {tokens}. {REPORT_BUG}")
        finish = (meta.get("finish_reason") or {}).get("type")
        if finish == "length" and len(tokens) != max_response_len:
            raise RolloutEngineError(
                f"{self.name}: SGLang ended a response at {len(tokens)} tokens for 'length', but "
                f"--rollout-max-response-len is {max_response_len}: it capped the request (its KV cache or context "
                "holds fewer tokens); raise --sglang-max-total-tokens or lower --rollout-max-response-len.")
        if finish not in ("stop", "length"):
            raise RolloutEngineError(f"{self.name}: SGLang finished a request with {meta.get('finish_reason')!r}")
        log_probs, kept_ids = [float(entry[0]) for entry in entries], None
        if options.truncates and options.logprobs == "truncated":
            log_probs, kept_ids = truncated_from_top(meta["output_top_logprobs"], tokens, options,
                                                     self.config.vocab_size)
        stamped = meta["weight_version"]  # "default" before the first update
        row = GeneratedRow(tokens, log_probs, kept_ids, finish == "stop")
        return row, 0 if stamped == "default" else int(stamped)

    def shutdown(self) -> None:
        self.server.stop()



def sampling_params(temperature: float, max_response_len: int, options: SamplingOptions) -> dict:
    """SGLang's sampling parameters: every one that changes the log-prob definition is explicit (the model's
    generation_config.json would otherwise fill the unset ones), the filters and stops are the run's."""
    return {"temperature": float(temperature), "max_new_tokens": max_response_len, **NEUTRAL_SAMPLING,
            "top_k": options.top_k if options.top_k > 0 else -1, "top_p": options.top_p, "min_p": options.min_p,
            "stop": list(options.stop) or None, "stop_token_ids": list(options.stop_token_ids) or None}


def top_logprobs_num(options: SamplingOptions, vocab_size: int) -> int | None:
    """How many top log-probs SGLang returns per token: enough to cover every kept set (the top-k, else the whole
    vocabulary), never more than the vocabulary (SGLang's scheduler dies on a topk out of range); None: no filter."""
    if not (options.truncates and options.logprobs == "truncated"):
        return None
    return vocab_size if options.top_k <= 0 else min(options.top_k, vocab_size)


def truncated_from_top(top_per_token: list, tokens: list[int], options: SamplingOptions,
                       vocab_size: int) -> tuple[list[float], list[list[int]]]:
    """The behavior log-prob of each token under the kept set, from SGLang's whole-softmax log-probs of the most
    likely tokens (``output_top_logprobs``: (logprob, token_id, text) per entry, highest first): the kept set is
    ``kept_tokens`` on those entries (the rule reads only the sorted top of the distribution), and
    log q = log p - logsumexp(log p over the kept set). The entries must cover the kept set: all of them kept is
    refused unless they are the whole vocabulary or the top-k itself."""
    log_probs, kept_ids = [], []
    for token, top in zip(tokens, top_per_token, strict=True):
        top_log_probs = torch.tensor([[float(entry[0]) for entry in top]])  # (1, N)
        ids = [int(entry[1]) for entry in top]
        kept = kept_tokens(top_log_probs, options.top_p, options.top_k, options.min_p)  # (1, N)
        if bool(kept.all()) and len(ids) < vocab_size and len(ids) != options.top_k:
            raise RolloutEngineError(f"SGLang returned {len(ids)} top log-probs and all are kept: the kept set may "
                                     f"be larger. {REPORT_BUG}")
        if token not in ids or not bool(kept[0, ids.index(token)]):
            raise RolloutEngineError(f"SGLang sampled token {token}, outside the kept set {sorted(ids)} its top "
                                     f"log-probs give under top-p {options.top_p}, top-k {options.top_k}, min-p "
                                     f"{options.min_p}. {REPORT_BUG}")
        log_probs.append(float(renormalized_log_probs(top_log_probs, kept)[0, ids.index(token)]))
        kept_ids.append(sorted(i for i, k in zip(ids, kept[0].tolist(), strict=True) if k))
    return log_probs, kept_ids

