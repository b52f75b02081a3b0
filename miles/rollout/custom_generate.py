"""``--custom-generate-function-path module.function``: upstream's per-sample generate function, run by the rollout
manager in place of its batched engine call (docs/rollout.md).

Both of upstream's forms: the legacy ``async def fn(args, sample, sampling_params)`` (or with a keyword
``evaluation``) returning the sample, and the class form ``async def fn(input: GenerateFnInput) -> GenerateFnOutput``
(``miles.rollout.base_types``). The function talks HTTP to the router at ``args.sglang_router_ip/port`` (with
``miles.utils.http_utils.post``, or the ready-made ``miles.rollout.sglang_rollout.generate``). ``sampling_params``
holds upstream's keys and a ``sampling_seed`` per sample, so a rollout is reproducible from its seed.

The behavior-policy contract holds for every token the function trains, witnessed by the engines, not taken from the
function's bookkeeping (``witness``): each engine's HTTP server records what it served, by its context (the request's
tokens), with the generated tokens, their log-probs, and the weight versions and fingerprint of the weights that
produced them (``miles.rollout.engine_server``). A returned sample is a series of engine turns, each an answer served
after exactly the tokens before it, with exactly its log-probs, and tokens the function added between them (a tool's
output, an observation) with loss mask 0 (``served_segments``): a multi-turn sample as upstream's agents build it.
miles then sets its weight versions, fingerprint, kept ids and turns (``sample.segments``) from the records (a version
the function recorded itself must agree). A trained token no engine generated there is refused naming the function,
the sample and the position. A function may change the prompt or the sampling parameters, zero entries of the loss
mask (an empty mask means every response token is trained, as upstream), and set ``sample.reward`` (else the reward
function scores it).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
import zlib
from collections.abc import Callable

from miles.rollout.base_types import GenerateFnInput
from miles.rollout.generate_api import GenerateState
from miles.utils.async_utils import run
from miles.utils.errors import MilesConfigError
from miles.utils.types import Sample, SampleStatus

FLAG = "--custom-generate-function-path"


def load_generate_function(path: str):
    """The function at ``module.function`` (upstream's form), checked to be one of upstream's two signatures."""
    module_name, _, name = path.rpartition(".")
    if not module_name:
        raise MilesConfigError(f"{FLAG} {path!r}: give module.function, e.g. examples.custom_generate.generate "
                               "(the module importable from the launch's folder or PYTHONPATH).")
    try:
        fn = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as error:
        raise MilesConfigError(f"{FLAG} {path!r}: {type(error).__name__}: {error}. Put the module on PYTHONPATH "
                               "or fix the name.") from None
    if not inspect.iscoroutinefunction(fn):
        raise MilesConfigError(f"{FLAG} {path!r} is not an async function; write async def {name}(args, sample, "
                               "sampling_params) and await miles.rollout.sglang_rollout.generate in it.")
    params = list(inspect.signature(fn).parameters)
    if len(params) != 1 and len(params) < 3:
        raise MilesConfigError(f"{FLAG} {path!r} takes ({', '.join(params)}); upstream's signatures are "
                               f"{name}(input: GenerateFnInput) and {name}(args, sample, sampling_params[, evaluation]).")
    return fn


# the launch's sampling keys a generate function receives (upstream's names; the log-prob mode is the servers')
SAMPLING_KEYS = ("top_p", "top_k", "min_p", "stop", "stop_token_ids")


def upstream_sampling_params(temperature: float, max_new_tokens: int, sampling: dict) -> dict:
    """The ``sampling_params`` a generate function receives: upstream's keys, from the engines' sampling dict."""
    return {"temperature": temperature, "max_new_tokens": max_new_tokens,
            **{key: sampling[key] for key in SAMPLING_KEYS if key in sampling}, "no_stop_trim": True}


def sample_seed(seed: int, index: int) -> int:
    """The ``sampling_seed`` of sample ``index`` of a rollout seeded ``seed`` (31 bits, as SGLang takes it)."""
    return zlib.crc32(f"{seed}:{index}".encode()) & 0x7FFFFFFF


def custom_samples(fn, args, prompts: list[dict], n_samples: int, sampling_params: dict, seed: int,
                   evaluation: bool, take_witnessed: Callable[[], dict]) -> list[Sample]:
    """``n_samples`` samples per prompt (contiguous), each made by ``fn``, checked against what the engines served
    (``take_witnessed()``: every engine's records since the last call, merged)."""
    samples = [Sample(group_index=index // n_samples, index=index, prompt=prompts[index // n_samples]["prompt"],
                      label=prompts[index // n_samples].get("label", ""), tokens=[], response_length=0,
                      status=SampleStatus.PENDING)
               for index in range(len(prompts) * n_samples)]
    take_witnessed()  # forget answers served outside this generation
    returned = run(_call_every(fn, args, samples, sampling_params, seed, evaluation))
    witnessed = take_witnessed()
    name = f"{FLAG} {args.custom_generate_function_path}"
    for position, sample in enumerate(returned):
        witness(name, position, sample, witnessed)
    return returned


async def _call_every(fn, args, samples: list[Sample], sampling_params: dict, seed: int,
                      evaluation: bool) -> list[Sample]:
    """Call ``fn`` on every sample concurrently, as upstream's ``generate_and_rm`` does."""
    params = list(inspect.signature(fn).parameters)
    class_form = len(params) == 1
    takes_evaluation = "evaluation" in params

    async def one(sample: Sample):
        own = {**sampling_params, "sampling_seed": sample_seed(seed, sample.index)}  # each call its own copy
        if class_form:
            output = await fn(GenerateFnInput(GenerateState(args), sample, own, evaluation))
            return output.samples
        if takes_evaluation:
            return await fn(args, sample, own, evaluation=evaluation)
        return await fn(args, sample, own)

    return list(await asyncio.gather(*(one(sample) for sample in samples)))


def served_segments(where: str, sample: Sample, witnessed: dict) -> list[tuple[int, object]]:
    """The engine turns of ``sample``: (response position, the answer served there), found by walking the response:
    at each position, an answer served after exactly the tokens before it whose tokens and log-probs come next is a
    turn (the longest such; it is claimed, so it backs one sample); any other token is one the function added, and
    must have loss mask 0. A mask-1 token no engine generated there is refused naming its position."""
    tokens, start, log_probs = sample.tokens, sample.prompt_length, [float(x) for x in sample.rollout_log_probs]
    segments, position, near_miss = [], 0, False
    while position < sample.response_length:
        answers = witnessed.get(tuple(tokens[:start + position]), [])
        rest, rest_log_probs = tuple(tokens[start + position:]), log_probs[position:]
        matching = [a for a in answers if rest[:len(a.tokens)] == a.tokens]
        exact = [a for a in matching if [float(x) for x in a.log_probs] == rest_log_probs[:len(a.tokens)]]
        if exact:
            served = max(exact, key=lambda answer: len(answer.tokens))
            answers.remove(served)  # one answer backs one turn of one sample
            segments.append((position, served))
            position += len(served.tokens)
            continue
        near_miss = near_miss or bool(matching)
        if sample.loss_mask[position]:
            if near_miss:
                raise MilesConfigError(f"{where} a Sample whose rollout_log_probs are not the engine's: the trainer "
                                       "needs the behavior policy's own log-probs. Keep the answer's "
                                       "output_token_logprobs.")
            if not segments:
                raise MilesConfigError(f"{where} a Sample whose tokens no engine served in this rollout (or whose "
                                       "answer another sample already claimed); fill the sample from the router's "
                                       "/generate answer (update_sample_from_response) and keep its tokens.")
            raise MilesConfigError(f"{where} a Sample whose response token {position} has loss mask 1 but no engine "
                                   "generated it after the tokens before it (edited, or added by the function, or "
                                   "generated after another context, such as a text request the engine tokenized "
                                   "differently); give the tokens you add loss mask 0.")
        position += 1
    if not segments:
        raise MilesConfigError(f"{where} a Sample whose tokens no engine served in this rollout (or whose answer "
                               "another sample already claimed); fill the sample from the router's /generate answer "
                               "(update_sample_from_response) and keep its tokens.")
    return segments


def kept_ids_of(where: str, sample: Sample, segments: list) -> list[list[int]] | None:
    """The kept ids per response token: each turn's, and for a token the function added, the token alone (its
    log-prob under that set is 0, upstream's value for it; the token has loss mask 0 and is never trained). None when
    every turn was sampled from the whole softmax."""
    if all(served.kept_ids is None for _, served in segments):
        return None
    if any(served.kept_ids is None for _, served in segments):
        raise MilesConfigError(f"{where} a Sample whose turns mix truncated (top-k/top-p/min-p) and whole-softmax "
                               "sampling; that mix is not implemented yet: sample every turn alike.")
    response = sample.tokens[sample.prompt_length:]
    kept = [[token] for token in response]
    for position, served in segments:
        kept[position:position + len(served.tokens)] = served.kept_ids
    return kept


def witness(name: str, position: int, sample, witnessed: dict) -> None:
    """The behavior-policy contract of one returned sample (module docstring): checked, then completed from the
    engine's record; else one line naming the field."""
    where = f"{name} returned for sample {position}"
    if not isinstance(sample, Sample):
        raise MilesConfigError(f"{where} a {type(sample).__name__}, not one Sample; return the sample it was given "
                               "(a list of samples per prompt is not implemented in miles yet).")
    if sample.status == SampleStatus.ABORTED:
        raise MilesConfigError(f"{where} a Sample its engine aborted (finish_reason abort); miles trains only "
                               "finished responses and does not regenerate aborted ones yet. Do not abort requests "
                               "during a rollout, or regenerate the sample in the function.")
    length = sample.response_length
    if not sample.loss_mask:
        sample.loss_mask = [1] * length  # upstream's default: every response token is trained
    for field_name in ("loss_mask", "rollout_log_probs"):
        if len(getattr(sample, field_name) or []) != length:
            raise MilesConfigError(f"{where} a Sample whose {field_name} has {len(getattr(sample, field_name) or [])} "
                                   f"entries for its {length} response tokens; it needs one per response token.")
    if length < 1 or not set(sample.loss_mask) <= {0, 1}:
        raise MilesConfigError(f"{where} a Sample with response_length {length} and loss_mask values "
                               f"{sorted(set(sample.loss_mask))}; it needs a response and a 0/1 mask.")
    segments = served_segments(where, sample, witnessed)
    versions = sorted({version for _, served in segments for version in served.weight_versions})
    if sample.weight_versions and sorted(set(sample.weight_versions)) != versions:
        raise MilesConfigError(f"{where} a Sample whose weight_versions {sample.weight_versions} are not the ones the "
                               f"engine served it with ({versions}).")
    if len({served.weight_fingerprint for _, served in segments}) > 1:
        raise MilesConfigError(f"{where} a Sample whose turns were served by weights of versions {versions}; a "
                               "sample that spans weight versions (fully-async training) is not implemented yet.")
    sample.weight_versions, sample.weight_fingerprint = versions, segments[0][1].weight_fingerprint
    sample.sampling_kept_ids = kept_ids_of(where, sample, segments)
    sample.segments = [{"turn": turn, "start": start, "end": start + len(served.tokens),
                        "weight_version": served.weight_versions[-1]} for turn, (start, served) in enumerate(segments)]
    if sample.reward is not None and not (isinstance(sample.reward, (int, float)) and math.isfinite(sample.reward)):
        raise MilesConfigError(f"{where} a Sample whose reward is {sample.reward!r}; set a finite number, or leave it "
                               "None for the reward function.")
