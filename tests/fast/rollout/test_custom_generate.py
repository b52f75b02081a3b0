"""--custom-generate-function-path (miles/rollout/custom_generate.py): upstream's per-sample functions, both forms,
run by the rollout manager against a real torch engine behind its HTTP server (the router's place is taken by the
server itself: the router has tests of its own), and the behavior-policy contract on what the functions return,
witnessed by the server."""

import copy
import json
import math

import pytest

from miles.ray import rollout_manager as rollout_manager_module
from miles.ray.rollout_manager import RolloutManager
from miles.rollout.base_types import GenerateFnInput, GenerateFnOutput
from miles.rollout.custom_generate import load_generate_function
from miles.rollout.generate_api import GenerateState, compute_prompt_ids_from_sample, update_sample_from_response
from miles.rollout.generate_hub import single_turn
from miles.rollout.sglang_rollout import generate
from miles.utils.arguments import parse_args
from miles.utils.async_utils import run
from miles.utils.errors import MilesConfigError, RolloutEngineError
from miles.utils.http_utils import post
from miles.utils.types import Sample, SampleStatus
from tests.fast.rollout.reference import forward_log_probs

HERE = __name__  # the functions below are named by this module's dotted path, as a launch names its own
SEEN = []  # (prompt, evaluation, sampling_params) of each call of `colder`


async def colder(args, sample, sampling_params, evaluation=False):
    """Upstream's usual template: change the sampling parameters, then generate."""
    SEEN.append((sample.prompt, evaluation, dict(sampling_params)))
    params = copy.deepcopy(sampling_params)
    params["temperature"] = sampling_params["temperature"] / 2
    params["top_k"] = 4
    return await generate(args, sample, params)


async def by_hand(args, sample, sampling_params):
    """Upstream's search-r1 shape: the state's tokenizer, one POST to the router, the sample filled from the answer,
    no version bookkeeping of its own."""
    state = GenerateState(args)
    payload = {"input_ids": compute_prompt_ids_from_sample(state, sample), "sampling_params": sampling_params,
               "return_logprob": True}
    output = await post(f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate", payload)
    sample.tokens = payload["input_ids"] + [entry[1] for entry in output["meta_info"]["output_token_logprobs"]]
    sample.response_length = len(output["output_ids"])
    sample.response = output["text"]
    sample.rollout_log_probs = [entry[0] for entry in output["meta_info"]["output_token_logprobs"]]
    sample.status = SampleStatus.TRUNCATED if output["meta_info"]["finish_reason"]["type"] == "length" else \
        SampleStatus.COMPLETED
    return sample


async def class_form(input: GenerateFnInput) -> GenerateFnOutput:  # noqa: A002 - upstream's name
    output = await single_turn.generate(input)
    output.samples.reward = 0.25
    output.samples.loss_mask = [1] * (output.samples.response_length - 1) + [0]  # a function may mask tokens out
    return output


async def hand_made(args, sample, sampling_params):
    sample.tokens, sample.response_length = [1, 2, 3], 2
    sample.loss_mask, sample.rollout_log_probs, sample.weight_versions = [1, 1], [-1.0, -1.0], [3]
    return sample


async def short_mask(args, sample, sampling_params):
    sample = await generate(args, sample, sampling_params)
    sample.loss_mask = [1] * (sample.response_length + 1)
    return sample


async def other_log_probs(args, sample, sampling_params):
    sample = await generate(args, sample, sampling_params)
    sample.rollout_log_probs = [value - 0.5 for value in sample.rollout_log_probs]
    return sample


async def other_version(args, sample, sampling_params):
    sample = await generate(args, sample, sampling_params)
    sample.weight_versions = [7]
    return sample


async def two(args, sample, sampling_params):
    other = copy.deepcopy(sample)
    return [await generate(args, sample, sampling_params), await generate(args, other, sampling_params)]


async def nan_reward(args, sample, sampling_params):
    sample = await generate(args, sample, sampling_params)
    sample.reward = math.nan
    return sample


async def aborted(args, sample, sampling_params):
    sample = await generate(args, sample, sampling_params)
    sample.status = SampleStatus.ABORTED
    return sample


async def penalized(args, sample, sampling_params):
    return await generate(args, sample, {**sampling_params, "repetition_penalty": 1.1})


TOOL_TEXT = "+1="  # what the stand-in tool returns after each turn: tokens of the embedded vocabulary


async def two_turns(args, sample, sampling_params, *, tool_mask: int = 0, tool_in_context: bool = True):
    """Upstream's multi-turn shape (search-r1's): an engine turn, the tool's output appended with loss mask 0 and
    log-prob 0.0, a second engine turn after all of it; the function records no versions."""
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    prompt_ids = compute_prompt_ids_from_sample(state, sample)
    sample.tokens, sample.loss_mask, sample.rollout_log_probs = list(prompt_ids), [], []
    for turn in range(2):
        context = sample.tokens if tool_in_context or turn == 0 else sample.tokens[:len(prompt_ids)]
        output = await post(url, {"input_ids": context, "sampling_params": sampling_params, "return_logprob": True})
        await update_sample_from_response(args, sample, {"input_ids": context}, output, update_loss_mask=True)
        if turn == 0:
            tool = state.tokenizer.encode(TOOL_TEXT, add_special_tokens=False)
            sample.tokens += tool
            sample.response_length += len(tool)
            sample.response += TOOL_TEXT
            sample.loss_mask += [tool_mask] * len(tool)
            sample.rollout_log_probs += [0.0] * len(tool)
    return sample


async def tool_trained(args, sample, sampling_params):
    return await two_turns(args, sample, sampling_params, tool_mask=1)


async def other_context(args, sample, sampling_params):
    return await two_turns(args, sample, sampling_params, tool_in_context=False)


def not_async(args, sample, sampling_params):
    return sample


async def two_arguments(args, sample):
    return sample


class _ServedEngine:
    """An engine actor as the manager calls it (``ray.get`` is the identity here): its server's records."""

    def __init__(self, server):
        self.take_witnessed = self
        self.server = server

    def remote(self):
        return self.server.take_witnessed()


def _manager(tmp_path, monkeypatch, server, function: str, *argv):
    monkeypatch.setattr(rollout_manager_module.ray, "get", lambda values: values)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in [{"prompt": "3+4=", "label": "7"},
                                                                 {"prompt": "12+345=", "label": "357"}]))
    host, port = server.url.removeprefix("http://").split(":")
    args = parse_args(argv=["--train-backend", "torch", "--prompt-data", str(data), "--eval-prompt-data", str(data),
                            "--hf-checkpoint", server.engine.model_path, "--rollout-batch-size", "2",
                            "--n-samples-per-prompt", "2", "--rollout-temperature", "0.8",
                            "--rollout-max-response-len", "4", "--sglang-router-ip", host, "--sglang-router-port", port,
                            "--custom-generate-function-path", f"{HERE}.{function}", *argv])
    return RolloutManager(args, [_ServedEngine(server)])


def _forward_log_probs(engine, sample, temperature: float) -> list[float]:
    prompt, response = sample.tokens[:sample.prompt_length], sample.tokens[sample.prompt_length:]
    return forward_log_probs(engine, prompt, response, temperature, sample.sampling_kept_ids)


def test_the_function_generates_over_http_with_its_own_sampling_parameters(tmp_path, monkeypatch, server):
    SEEN.clear()
    manager = _manager(tmp_path, monkeypatch, server, "colder", "--n-samples-per-eval-prompt", "1")
    batch, metrics = manager.generate(rollout_id=0)
    assert [(s.prompt, s.index, s.group_index) for s in batch.samples] == [
        ("3+4=", 0, 0), ("3+4=", 1, 0), ("12+345=", 2, 1), ("12+345=", 3, 1)]
    first = SEEN[0][2]
    assert (SEEN[0][:2], {k: first[k] for k in ("temperature", "max_new_tokens", "top_p", "top_k", "min_p")}) == (
        ("3+4=", False), {"temperature": 0.8, "max_new_tokens": 4, "top_p": 1.0, "top_k": -1, "min_p": 0.0})
    assert len({params["sampling_seed"] for _, _, params in SEEN}) == 4  # each sample seeded apart
    for sample in batch.samples:  # the witness's facts: the version and fingerprint of the weights that served it
        assert sample.weight_versions == [0] and sample.weight_fingerprint == server.engine.weight_fingerprint
        assert all(len(ids) <= 4 for ids in sample.sampling_kept_ids)  # the function's top_k 4 acted
        assert sample.rollout_log_probs == pytest.approx(_forward_log_probs(server.engine, sample, 0.4), abs=1e-5)
        assert sample.loss_mask == [1] * sample.response_length
    assert metrics["rollout/num_samples"] == 4.0 and manager.args.partial_rollout is False  # upstream reads it
    again, _ = _manager(tmp_path, monkeypatch, server, "colder").generate(rollout_id=0)
    assert [s.tokens for s in again.samples] == [s.tokens for s in batch.samples]  # reproducible from the seed
    SEEN.clear()
    assert "eval/aime" in manager.evaluate(rollout_id=0)  # evaluation goes through the function too
    assert [evaluation for _, evaluation, _ in SEEN] == [True, True]


@pytest.mark.parametrize("function", ["by_hand", "class_form"])
def test_upstreams_hand_written_and_class_forms_train_the_engines_answers(tmp_path, monkeypatch, server, function):
    batch, _ = _manager(tmp_path, monkeypatch, server, function).generate(rollout_id=0)
    for sample in batch.samples:
        assert sample.weight_versions == [0] and sample.rollout_log_probs == pytest.approx(
            _forward_log_probs(server.engine, sample, 0.8), abs=1e-5)
    if function == "class_form":
        assert {s.reward for s in batch.samples} == {0.25}
        assert all(s.loss_mask[-1] == 0 for s in batch.samples)


def test_a_multi_turn_sample_is_witnessed_turn_by_turn_and_the_tools_tokens_are_mask_0(tmp_path, monkeypatch, server):
    manager = _manager(tmp_path, monkeypatch, server, "two_turns", "--rollout-top-k", "6")
    batch, _ = manager.generate(rollout_id=0)
    tool = server.engine.tokenizer.encode(TOOL_TEXT, add_special_tokens=False)
    for sample in batch.samples:
        first, second = sample.segments
        assert (first["turn"], first["start"], second["turn"]) == (0, 0, 1)
        assert second["start"] == first["end"] + len(tool) and second["end"] == sample.response_length
        assert {first["weight_version"], second["weight_version"]} == {0} and sample.weight_versions == [0]
        response = sample.tokens[sample.prompt_length:]
        assert response[first["end"]:second["start"]] == tool
        assert sample.loss_mask == [1] * first["end"] + [0] * len(tool) + [1] * (second["end"] - second["start"])
        # the tool's tokens keep only themselves (log-prob 0 = upstream's 0.0); the turns keep the engine's top 6
        assert sample.sampling_kept_ids[first["end"]:second["start"]] == [[token] for token in tool]
        assert all(len(ids) <= 6 for ids in sample.sampling_kept_ids[:first["end"]])
        # every log-prob, turn 2's conditioned on the tool's output, from one forward pass over the whole sample
        assert sample.rollout_log_probs == pytest.approx(_forward_log_probs(server.engine, sample, 0.8), abs=1e-5)


@pytest.mark.parametrize(("function", "pattern"), [
    ("hand_made", r"returned for sample 0 a Sample whose tokens no engine served in this rollout"),
    ("short_mask", r"returned for sample 0 a Sample whose loss_mask has \d+ entries for its \d+ response tokens"),
    ("other_log_probs", r"returned for sample 0 a Sample whose rollout_log_probs are not the engine's"),
    ("other_version", r"returned for sample 0 a Sample whose weight_versions \[7\] are not the ones the engine"),
    ("two", r"returned for sample 0 a list, not one Sample"),
    ("nan_reward", r"returned for sample 0 a Sample whose reward is nan"),
    ("aborted", r"returned for sample 0 a Sample its engine aborted"),
    ("tool_trained", r"returned for sample 0 a Sample whose response token \d+ has loss mask 1 but no engine generated it"),
    ("other_context", r"returned for sample 0 a Sample whose response token \d+ has loss mask 1 but no engine generated"),
])
def test_a_sample_that_breaks_the_contract_is_refused_naming_the_function_and_the_field(
        tmp_path, monkeypatch, server, function, pattern):
    manager = _manager(tmp_path, monkeypatch, server, function)
    with pytest.raises(MilesConfigError, match=pattern) as caught:
        manager.generate(rollout_id=0)
    assert str(caught.value).startswith(f"--custom-generate-function-path {HERE}.{function} ")
    assert "\n" not in str(caught.value)


def test_a_request_the_engine_would_serve_differently_stops_the_rollout_with_the_servers_reason(
        tmp_path, monkeypatch, server):
    with pytest.raises(RolloutEngineError, match=r"HTTP 400.*repetition_penalty=1.1 would change"):
        _manager(tmp_path, monkeypatch, server, "penalized").generate(rollout_id=0)


@pytest.mark.parametrize(("function", "pattern"), [
    ("not_async", r"is not an async function"),
    ("two_arguments", r"takes \(args, sample\); upstream's signatures are"),
    ("missing", r"AttributeError"),
])
def test_a_function_miles_cannot_call_is_refused_when_loaded(function, pattern):
    with pytest.raises(MilesConfigError, match=f"^--custom-generate-function-path '{HERE}.{function}'.*{pattern}"):
        load_generate_function(f"{HERE}.{function}")
    with pytest.raises(MilesConfigError, match=r"give module.function"):
        load_generate_function("generate")


def test_update_sample_from_response_appends_as_upstream():
    sample = Sample(group_index=0, index=0, prompt="p", label="", tokens=[], response_length=0)
    output = {"text": "7", "output_ids": [9, 2], "meta_info": {
        "output_token_logprobs": [[-0.5, 9, None], [-0.25, 2, None]], "weight_version": "2",
        "finish_reason": {"type": "stop"}}}
    run(update_sample_from_response(None, sample, {"input_ids": [4, 5]}, output, update_loss_mask=True))
    assert (sample.tokens, sample.response_length, sample.response) == ([4, 5, 9, 2], 2, "7")
    assert (sample.rollout_log_probs, sample.loss_mask, sample.weight_versions) == ([-0.5, -0.25], [1, 1], [2])
    assert sample.status == SampleStatus.COMPLETED
