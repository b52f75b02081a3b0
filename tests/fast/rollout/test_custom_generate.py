"""--custom-generate-function-path (miles/rollout/custom_generate.py): upstream's per-sample function run by the
rollout manager over a stand-in engine whose answers are made by hand, and the behavior-policy contract on what the
function returns."""

import copy
import json
import math

import pytest

from miles.ray import rollout_manager as rollout_manager_module
from miles.ray.rollout_manager import RolloutManager
from miles.rollout.custom_generate import load_generate_function
from miles.rollout.sglang_rollout import generate
from miles.utils.arguments import parse_args
from miles.utils.errors import MilesConfigError
from miles.utils.types import Sample, SampleStatus

HERE = __name__  # the functions below are named by this module's dotted path, as a launch names its own
LOG_PROBS = [-0.5, -0.25, -0.125]  # the stand-in engine's log-prob of each of its 3 response tokens


class _StandInEngine:
    """An engine actor's ``generate`` as the manager calls it: one response of 3 tokens per prompt (its prompt
    tokens are its characters' codes), weight version 3, and every request recorded."""

    def __init__(self):
        self.generate = self
        self.calls = []

    def remote(self, prompts, n_samples, temperature, max_response_len, seed, sampling):
        self.calls.append({"prompt": prompts[0]["prompt"], "n": n_samples, "temperature": temperature,
                           "max_response_len": max_response_len, "seed": seed, **sampling})
        (prompt,) = prompts
        response = [10 + len(self.calls), 11, 12]  # differs per call, so each answer's tokens are its own

        async def answer():
            return [Sample(group_index=0, index=0, prompt=prompt["prompt"], label=prompt["label"],
                           tokens=[ord(c) for c in prompt["prompt"]] + response, response_length=3,
                           response=prompt["label"] if "right" in prompt["prompt"] else "no",
                           loss_mask=[1, 1, 1], rollout_log_probs=list(LOG_PROBS), weight_versions=[3],
                           weight_fingerprint="f" * 32, status=SampleStatus.TRUNCATED)]

        return answer()


SEEN = []  # (prompt, evaluation, sampling_params) of each call of `colder`


async def colder(args, sample, sampling_params, evaluation=False):
    """Upstream's usual template: change the sampling parameters, then generate."""
    SEEN.append((sample.prompt, evaluation, dict(sampling_params)))
    params = copy.deepcopy(sampling_params)
    params["temperature"] = sampling_params["temperature"] / 2
    params["top_k"] = 4
    return await generate(args, sample, params)


async def rewarded(args, sample, sampling_params):
    sample = await generate(args, sample, sampling_params)
    sample.reward = 0.25
    sample.loss_mask = [1, 1, 0]  # a function may mask tokens out
    return sample


async def hand_made(args, sample, sampling_params):
    sample.tokens, sample.response_length = [1, 2, 3], 2
    sample.loss_mask, sample.rollout_log_probs, sample.weight_versions = [1, 1], [-1.0, -1.0], [3]
    return sample


async def short_mask(args, sample, sampling_params):
    sample = await generate(args, sample, sampling_params)
    sample.loss_mask = [1, 1]
    return sample


async def other_log_probs(args, sample, sampling_params):
    sample = await generate(args, sample, sampling_params)
    sample.rollout_log_probs = [-1.0, -1.0, -1.0]
    return sample


async def no_version(args, sample, sampling_params):
    sample = await generate(args, sample, sampling_params)
    sample.weight_versions = []
    return sample


async def two(args, sample, sampling_params):
    other = copy.deepcopy(sample)
    return [await generate(args, sample, sampling_params), await generate(args, other, sampling_params)]


async def nan_reward(args, sample, sampling_params):
    sample = await generate(args, sample, sampling_params)
    sample.reward = math.nan
    return sample


async def unknown_key(args, sample, sampling_params):
    return await generate(args, sample, {**sampling_params, "repetition_penalty": 1.1})


def not_async(args, sample, sampling_params):
    return sample


async def new_style(input):
    return input


def _manager(tmp_path, monkeypatch, function: str, *argv):
    monkeypatch.setattr(rollout_manager_module.ray, "get", lambda values: values)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in [{"prompt": "right", "label": "7"},
                                                                 {"prompt": "wrong", "label": "8"}]))
    args = parse_args(argv=["--train-backend", "torch", "--prompt-data", str(data), "--eval-prompt-data", str(data),
                            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-temperature",
                            "0.8", "--rollout-max-response-len", "5", "--custom-generate-function-path",
                            f"{HERE}.{function}", *argv])
    engines = [_StandInEngine(), _StandInEngine()]
    return RolloutManager(args, engines), engines


def test_the_function_generates_through_the_engines_with_its_own_sampling_parameters(tmp_path, monkeypatch):
    SEEN.clear()
    manager, engines = _manager(tmp_path, monkeypatch, "colder", "--n-samples-per-eval-prompt", "1")
    batch, metrics = manager.generate(rollout_id=0)
    assert [(s.prompt, s.index, s.group_index) for s in batch.samples] == [
        ("right", 0, 0), ("right", 1, 0), ("wrong", 2, 1), ("wrong", 3, 1)]
    assert SEEN[0] == ("right", False, {"temperature": 0.8, "max_new_tokens": 5, "top_p": 1.0, "top_k": -1,
                                        "min_p": 0.0, "stop": [], "stop_token_ids": []})
    calls = [call for engine in engines for call in engine.calls]
    assert len(calls) == 4 and len(engines[0].calls) == 2  # sample i on engine i mod 2, one response per call
    assert {(call["temperature"], call["top_k"], call["n"], call["max_response_len"]) for call in calls} == {(0.4, 4, 1, 5)}
    assert len({call["seed"] for call in calls}) == 4  # each sample seeded apart
    for sample in batch.samples:  # the engine's own answer, untouched
        assert (sample.rollout_log_probs, sample.weight_versions, sample.loss_mask) == (LOG_PROBS, [3], [1, 1, 1])
        assert sample.status == SampleStatus.TRUNCATED and sample.weight_fingerprint == "f" * 32
    assert [s.reward for s in batch.samples] == [1.0, 1.0, 0.0, 0.0]  # math_exact: "7" == "7", "no" != "8"
    assert metrics["rollout/reward_mean"] == 0.5
    SEEN.clear()
    assert manager.evaluate(rollout_id=0)["eval/aime"] == 0.5  # evaluation goes through the function too
    assert [evaluation for _, evaluation, _ in SEEN] == [True, True]


def test_a_reward_and_a_mask_the_function_sets_are_kept(tmp_path, monkeypatch):
    manager, _ = _manager(tmp_path, monkeypatch, "rewarded")
    batch, _ = manager.generate(rollout_id=0)
    assert [(s.reward, s.loss_mask) for s in batch.samples] == [(0.25, [1, 1, 0])] * 4


@pytest.mark.parametrize(("function", "pattern"), [
    ("hand_made", r"returned for sample 0 a Sample whose tokens no engine generated in this rollout"),
    ("short_mask", r"returned for sample 0 a Sample whose loss_mask has 2 entries for its 3 response tokens"),
    ("other_log_probs", r"returned for sample 0 a Sample whose rollout_log_probs is not the engine's"),
    ("no_version", r"returned for sample 0 a Sample whose weight_versions is not the engine's"),
    ("two", r"returned for sample 0 a list, not one Sample"),
    ("nan_reward", r"returned for sample 0 a Sample whose reward is nan"),
    ("unknown_key", r"sampling_params keys \['repetition_penalty'\] are not implemented"),
])
def test_a_sample_that_breaks_the_contract_is_refused_naming_the_function_and_the_field(
        tmp_path, monkeypatch, function, pattern):
    manager, _ = _manager(tmp_path, monkeypatch, function)
    with pytest.raises(MilesConfigError, match=pattern) as caught:
        manager.generate(rollout_id=0)
    named = "--custom-generate-function-path" + ("" if function == "unknown_key" else f" {HERE}.{function} ")
    assert str(caught.value).startswith(named) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("function", "pattern"), [
    ("not_async", r"is not an async function"),
    ("new_style", r"takes \(input\); miles calls upstream's signature"),
    ("missing", r"AttributeError"),
])
def test_a_function_miles_cannot_call_is_refused_when_loaded(function, pattern):
    with pytest.raises(MilesConfigError, match=f"^--custom-generate-function-path '{HERE}.{function}'.*{pattern}"):
        load_generate_function(f"{HERE}.{function}")
    with pytest.raises(MilesConfigError, match=r"give module.function"):
        load_generate_function("generate")


def test_generate_outside_a_rollout_says_where_it_works():
    import asyncio

    sample = Sample(group_index=0, index=0, prompt="p", label="", tokens=[], response_length=0)
    with pytest.raises(MilesConfigError, match=r"called outside a rollout: miles calls it only inside the function"):
        asyncio.run(generate(None, sample, {"temperature": 1.0, "max_new_tokens": 1}))
