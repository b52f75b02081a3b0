"""SGLang's ``/generate`` request and response, as every miles engine serves them (docs/rollout.md).

Pure functions, no torch: ``parse_generate`` turns a request body into a ``GenerateRequest`` (or an
``EndpointError``, answered 400 with its message), ``generate_answer`` turns one generated row into SGLang's answer.

The request: ``input_ids`` (one list, or a list of lists) or ``text`` (a string or a list), ``sampling_params`` with
SGLang's keys, ``return_logprob``, ``rid``. Keys that would change what a behavior log-prob means (penalties, a
minimum length, ``ignore_eos``, ``n`` > 1) are accepted only at their neutral value, and keys of features miles'
engines lack (streaming, LoRA, images, routed experts) only when off: either way a request miles would serve
differently from SGLang is refused with a message, never answered differently.

The answer (per row): ``text``, ``output_ids``, ``meta_info`` with ``id``, ``finish_reason`` (``{"type": "stop",
"matched": ...}``, ``{"type": "length", "length": n}`` or ``{"type": "abort", ...}``), ``prompt_tokens``,
``completion_tokens``, ``weight_version`` (SGLang's string) and, with ``return_logprob``, ``output_token_logprobs``
as SGLang's ``[logprob, token_id, None]`` per generated token.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

# sampling_params keys the engines honor, and SGLang's defaults for them
SAMPLING_DEFAULTS = {"temperature": 1.0, "max_new_tokens": 128, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                     "stop": None, "stop_token_ids": None, "sampling_seed": None}
# keys that only shape the answer's text
TEXT_DEFAULTS = {"skip_special_tokens": True, "spaces_between_special_tokens": True, "no_stop_trim": False}
# keys accepted only at this (neutral) value: any other changes the log-prob definition or the sample's meaning
NEUTRAL_ONLY = {"repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "min_new_tokens": 0,
                "ignore_eos": False, "n": 1, "json_schema": None, "regex": None, "ebnf": None,
                "custom_params": None, "logit_bias": None}
# request keys besides input_ids/text/sampling_params, accepted only when off (features miles' engines lack)
OFF_ONLY = {"stream": False, "lora_path": None, "image_data": None, "video_data": None, "audio_data": None,
            "return_routed_experts": False, "return_indexer_topk": False, "return_hidden_states": False,
            "return_entropy": False, "return_bytes": False, "background": False, "top_logprobs_num": 0,
            "token_ids_logprob": None, "session_params": None, "custom_logit_processor": None}
# request keys that change nothing miles serves (sglang-router adds some of them to every request it forwards)
IGNORED = {"logprob_start_len", "return_text_in_logprobs", "rid", "return_logprob", "bootstrap_host",
           "bootstrap_port", "bootstrap_room", "data_parallel_rank", "priority", "model", "log_metrics", "no_logs"}


class EndpointError(ValueError):
    """A request miles does not serve as asked: answered HTTP 400 with this message."""


@dataclass(frozen=True)
class GenerateRequest:
    """One ``/generate`` request, checked: the prompt rows and how to sample and answer them."""

    rows: list[list[int]] | None  # token ids per row, or None when the request gave text
    texts: list[str] | None
    batched: bool  # the request gave a list of prompts (the answer is a list)
    temperature: float
    max_new_tokens: int
    seed: int | None  # SGLang's sampling_seed; None: the engine's own stream
    sampling: dict  # the engines' SamplingOptions fields (top_p, top_k, min_p, stop, stop_token_ids)
    return_logprob: bool
    skip_special_tokens: bool
    no_stop_trim: bool
    rids: list[str] = field(default_factory=list)


def parse_generate(body: dict) -> GenerateRequest:
    """The checked request of a ``/generate`` body; an ``EndpointError`` names what miles does not serve."""
    if not isinstance(body, dict):
        raise EndpointError(f"the body is a {type(body).__name__}; send a JSON object")
    unknown = sorted(set(body) - {"input_ids", "text", "sampling_params"} - set(OFF_ONLY) - IGNORED)
    if unknown:
        raise EndpointError(f"request keys {unknown} are not served by miles' engines; the keys are input_ids or "
                            f"text, sampling_params, return_logprob, rid, and {sorted(OFF_ONLY)} when off")
    _require_neutral(body, OFF_ONLY, "request key", "is not implemented in miles' engines")
    rows, texts, batched = _prompts(body)
    params = body.get("sampling_params") or {}
    if isinstance(params, list):
        if len({repr(sorted(p.items())) for p in params}) > 1:
            raise EndpointError("a batch with different sampling_params per prompt is not served; send one request "
                                "per prompt or one sampling_params object")
        params = params[0] if params else {}
    known = {*SAMPLING_DEFAULTS, *TEXT_DEFAULTS, *NEUTRAL_ONLY}
    if unknown := sorted(set(params) - known):
        raise EndpointError(f"sampling_params keys {unknown} are not served by miles' engines; the keys are "
                            f"{sorted(known)}")
    _require_neutral(params, NEUTRAL_ONLY, "sampling_params", "would change what the behavior log-probs mean")
    sampling = {**SAMPLING_DEFAULTS, **{k: v for k, v in params.items() if k in SAMPLING_DEFAULTS and v is not None}}
    count = len(rows if rows is not None else texts)
    rid = body.get("rid")
    rids = list(rid) if isinstance(rid, list) else [rid] if rid else []
    return GenerateRequest(
        rows=rows, texts=texts, batched=batched, temperature=float(sampling["temperature"]),
        max_new_tokens=_positive_int(sampling["max_new_tokens"], "max_new_tokens"), seed=sampling["sampling_seed"],
        sampling={key: sampling[key] for key in ("top_p", "top_k", "min_p")}
        | {"stop": _strings(sampling["stop"]), "stop_token_ids": list(sampling["stop_token_ids"] or [])},
        return_logprob=bool(body.get("return_logprob", False)),
        skip_special_tokens=bool(params.get("skip_special_tokens", True)),
        no_stop_trim=bool(params.get("no_stop_trim", False)),
        rids=rids if len(rids) == count else [uuid.uuid4().hex for _ in range(count)])


def _prompts(body: dict) -> tuple[list[list[int]] | None, list[str] | None, bool]:
    """(token rows, texts, batched) of the request: exactly one of input_ids and text."""
    ids, text = body.get("input_ids"), body.get("text")
    if (ids is None) == (text is None):
        raise EndpointError("give exactly one of input_ids (token ids) and text")
    if text is not None:
        texts = [text] if isinstance(text, str) else text
        if not texts or not all(isinstance(t, str) and t for t in texts):
            raise EndpointError("text must be a non-empty string or a list of them")
        return None, list(texts), not isinstance(text, str)
    batched = bool(ids) and isinstance(ids[0], list)
    rows = ids if batched else [ids]
    if not rows or not all(row and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in row)
                           for row in rows):
        raise EndpointError("input_ids must be a non-empty list of token ids (ints >= 0), or a list of such lists")
    return [list(row) for row in rows], None, batched


def _require_neutral(values: dict, neutral: dict, what: str, why: str) -> None:
    for key, value in neutral.items():
        if values.get(key) is not None and values[key] != neutral[key]:
            raise EndpointError(f"{what} {key}={values[key]!r} {why}; send {neutral[key]!r} or leave it out")


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EndpointError(f"sampling_params {name}={value!r}: a positive integer is needed")
    return value


def _strings(stop) -> list[str]:
    return [] if stop is None else [stop] if isinstance(stop, str) else list(stop)


def generate_answer(rid: str, prompt_tokens: int, tokens: list[int], log_probs: list[float], stopped: bool,
                    weight_version: int, text: str, return_logprob: bool, aborted: bool = False) -> dict:
    """SGLang's answer to one generated row (module docstring)."""
    if aborted:
        finish = {"type": "abort", "message": "aborted by /abort_request before it was served"}
    elif stopped:
        finish = {"type": "stop", "matched": tokens[-1]}
    else:
        finish = {"type": "length", "length": len(tokens)}
    meta = {"id": rid, "finish_reason": finish, "prompt_tokens": prompt_tokens, "completion_tokens": len(tokens),
            "cached_tokens": 0, "weight_version": str(weight_version)}
    if return_logprob:
        meta["output_token_logprobs"] = [[float(lp), int(t), None] for lp, t in zip(log_probs, tokens, strict=True)]
    return {"text": text, "output_ids": list(tokens), "meta_info": meta}


def trimmed_text(text: str, stop: list[str], stopped: bool, no_stop_trim: bool) -> str:
    """SGLang's answer text: cut before the stop string that ended the response, unless ``no_stop_trim``."""
    if not stopped or no_stop_trim:
        return text
    ends = [text.rfind(s) for s in stop if s and text.rfind(s) >= 0]
    return text[:max(ends)] if ends else text
