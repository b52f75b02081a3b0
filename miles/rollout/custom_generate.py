"""``--custom-generate-function-path module.function``: upstream's per-sample generate function, run by the rollout
manager in place of its batched engine call (docs/training.md, "A custom generate function").

Upstream's signature (its ``LegacyGenerateFnAdapter``): ``async def fn(args, sample, sampling_params)``, or with a
keyword ``evaluation``, returning the sample. ``sampling_params`` holds upstream's keys (``temperature``, ``top_p``,
``top_k``, ``min_p``, ``max_new_tokens``, ``stop``, ``stop_token_ids``). Upstream's function reaches SGLang's router
over HTTP; miles has no router, so the function generates by awaiting ``generate(args, sample, sampling_params)``
(upstream's import path ``miles.rollout.sglang_rollout.generate`` works too): one response for ``sample.prompt``
from the configured engine (torch or SGLang), filling tokens, response, loss mask, log-probs, status, and the
weight version and fingerprint of the weights that sampled it.

The behavior-policy contract holds for every sample the function returns (``check_returned``): it is one
``Sample``, its loss mask and log-probs have one entry per response token, and its tokens, log-probs, weight
version and fingerprint are exactly what an engine call of this generation returned; a sample the function made
or changed itself is refused naming the function and the field. The runtime guard then checks the batch as any
other (docs/design.md §4). A function may change the prompt or the sampling parameters before generating, zero
entries of the loss mask, and set ``sample.reward`` (else the reward function scores it).
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import inspect
import math
import zlib
from dataclasses import dataclass, field

from miles.utils.errors import MilesConfigError
from miles.utils.types import Sample

FLAG = "--custom-generate-function-path"
# upstream's sampling_params keys, as the engines' names: temperature and max_new_tokens are their own arguments
SAMPLING_KEYS = {"top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "stop": "stop", "stop_token_ids": "stop_token_ids"}
ARGUMENT_KEYS = ("temperature", "max_new_tokens")


def load_generate_function(path: str):
    """The function at ``module.function`` (upstream's form), checked to be ``async def f(args, sample,
    sampling_params[, evaluation])``."""
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
    if len(params) < 3 or params[0] == "input":
        raise MilesConfigError(f"{FLAG} {path!r} takes ({', '.join(params)}); miles calls upstream's signature "
                               f"{name}(args, sample, sampling_params[, evaluation]) (upstream's GenerateFnInput "
                               "form is not implemented in miles yet).")
    return fn


@dataclass
class Generation:
    """What one rollout's (or evaluation's) custom generation needs from the manager: how to ask an engine, and a
    record of every engine answer, by its tokens, so the returned samples can be checked against it."""

    request: object  # (engine index, prompt dict, temperature, max_new_tokens, seed, sampling dict) -> awaitable
    num_engines: int
    seed: int
    engine_options: dict  # the launch's sampling dict (its log-prob mode and the rest), before the function's keys
    generated: dict = field(default_factory=dict)  # tuple(tokens) -> the engine's Sample
    calls: dict = field(default_factory=dict)  # sample index -> generate calls so far


CURRENT: contextvars.ContextVar[Generation] = contextvars.ContextVar("miles_custom_generation")


async def generate(args, sample: Sample, sampling_params: dict) -> Sample:
    """Generate one response for ``sample.prompt`` with the configured engine and fill ``sample`` with it (upstream's
    ``sglang_rollout.generate``); only inside a custom generate function that miles runs."""
    generation = CURRENT.get(None)
    if generation is None:
        raise MilesConfigError("miles.rollout.sglang_rollout.generate is called outside a rollout: miles calls it "
                               f"only inside the function of {FLAG}.")
    if sample.response_length:
        raise MilesConfigError(f"{FLAG}: generate got a sample that has a response already ({sample.response_length} "
                               "tokens); continuing a response (multi-turn) is not implemented in miles yet. Pass a "
                               "sample without one.")
    unknown = sorted(set(sampling_params) - set(SAMPLING_KEYS) - set(ARGUMENT_KEYS))
    if unknown:
        raise MilesConfigError(f"{FLAG}: sampling_params keys {unknown} are not implemented in miles' engines; the keys "
                               f"are {sorted([*SAMPLING_KEYS, *ARGUMENT_KEYS])}.")
    sampling = {**generation.engine_options,
                **{SAMPLING_KEYS[key]: value for key, value in sampling_params.items() if key in SAMPLING_KEYS}}
    call = generation.calls[sample.index] = generation.calls.get(sample.index, 0) + 1
    seed = zlib.crc32(f"{generation.seed}:{sample.index}:{call}".encode())  # reproducible per sample and call
    (answer,) = await generation.request(sample.index % generation.num_engines,
                                         {"prompt": sample.prompt, "label": sample.label},
                                         sampling_params["temperature"], sampling_params["max_new_tokens"], seed,
                                         sampling)
    generation.generated[tuple(answer.tokens)] = answer
    for name in ("tokens", "response", "response_length", "loss_mask", "rollout_log_probs", "weight_versions",
                 "weight_fingerprint", "status", "sampling_kept_ids"):
        setattr(sample, name, list(getattr(answer, name)) if isinstance(getattr(answer, name), list)
                else getattr(answer, name))
    return sample


def custom_samples(fn, args, generation: Generation, prompts: list[dict], n_samples: int, temperature: float,
                   max_response_len: int, evaluation: bool) -> list[Sample]:
    """``n_samples`` samples per prompt (contiguous), each made by ``fn``, with upstream's ``sampling_params``."""
    samples = [Sample(group_index=index // n_samples, index=index, prompt=prompts[index // n_samples]["prompt"],
                      label=prompts[index // n_samples].get("label", ""), tokens=[], response_length=0)
               for index in range(len(prompts) * n_samples)]
    options = generation.engine_options
    sampling_params = {"temperature": temperature, "max_new_tokens": max_response_len,
                       **{key: options[engine_key] for key, engine_key in SAMPLING_KEYS.items() if engine_key in options}}
    return run_custom_generation(fn, args, samples, sampling_params, generation, evaluation)


def run_custom_generation(fn, args, samples: list[Sample], sampling_params: dict, generation: Generation,
                          evaluation: bool) -> list[Sample]:
    """Call ``fn`` on every sample concurrently, as upstream's ``generate_and_rm`` does, and check what it returns."""
    takes_evaluation = "evaluation" in inspect.signature(fn).parameters

    async def one(sample: Sample):
        params = dict(sampling_params)  # each call its own copy: a function may change it
        if takes_evaluation:
            return await fn(args, sample, params, evaluation=evaluation)
        return await fn(args, sample, params)

    async def every():
        CURRENT.set(generation)
        return await asyncio.gather(*(one(sample) for sample in samples))

    returned = asyncio.run(every())
    name = f"{FLAG} {args.custom_generate_function_path}"
    for position, sample in enumerate(returned):
        check_returned(name, position, sample, generation.generated)
    return list(returned)


def check_returned(name: str, position: int, sample, generated: dict) -> None:
    """The behavior-policy contract of one returned sample (module docstring); else one line naming the field."""
    where = f"{name} returned for sample {position}"
    if not isinstance(sample, Sample):
        raise MilesConfigError(f"{where} a {type(sample).__name__}, not one Sample; return the sample it was given "
                               "(a list of samples per prompt is not implemented in miles yet).")
    length = sample.response_length
    for field_name in ("loss_mask", "rollout_log_probs"):
        if len(getattr(sample, field_name)) != length:
            raise MilesConfigError(f"{where} a Sample whose {field_name} has {len(getattr(sample, field_name))} "
                                   f"entries for its {length} response tokens; it needs one per response token.")
    if length < 1 or not set(sample.loss_mask) <= {0, 1}:
        raise MilesConfigError(f"{where} a Sample with response_length {length} and loss_mask values "
                               f"{sorted(set(sample.loss_mask))}; it needs a response and a 0/1 mask.")
    answer = generated.get(tuple(sample.tokens))
    if answer is None:
        raise MilesConfigError(f"{where} a Sample whose tokens no engine generated in this rollout; generate with "
                               "await miles.rollout.sglang_rollout.generate(args, sample, sampling_params) and keep "
                               "its tokens.")
    for field_name in ("response_length", "rollout_log_probs", "weight_versions", "weight_fingerprint"):
        if getattr(sample, field_name) != getattr(answer, field_name):
            raise MilesConfigError(f"{where} a Sample whose {field_name} is not the engine's: the trainer needs the "
                                   "behavior policy's own log-probs and the weight version that sampled them. "
                                   f"Keep generate's {field_name}.")
    if sample.reward is not None and not (isinstance(sample.reward, (int, float)) and math.isfinite(sample.reward)):
        raise MilesConfigError(f"{where} a Sample whose reward is {sample.reward!r}; set a finite number, or leave it "
                               "None for the reward function.")
