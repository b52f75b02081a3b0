"""Reward functions: the built-in rule, loading user functions, and the checks on what they return."""

import math
import sys

import numpy as np
import pytest

from miles.rollout.rm import (
    BUILTIN_REWARDS,
    CheckedReward,
    RewardFunctionError,
    get_reward_fn,
    math_exact,
)
from miles.utils.errors import MilesConfigError


@pytest.mark.parametrize(
    "response, label, expected",
    [
        ("7", "7", 1.0),
        (" 7\n", "7", 1.0),
        ("7<eos>", "7", 1.0),
        ("<bos>12<eos><pad><pad>", "12", 1.0),
        ("12<|im_end|>", "12", 1.0),
        ("</s>12", "12", 1.0),
        ("8", "7", 0.0),
        ("17", "7", 0.0),
        ("7 7", "7", 0.0),
        ("", "7", 0.0),
        ("7<eos>1", "7", 0.0),  # a token after the answer is a different answer
    ],
)
def test_math_exact(response, label, expected):
    assert math_exact("3+4=", response, label) == expected


def test_default_is_math_exact_and_checked():
    reward = get_reward_fn()
    assert reward.fn is math_exact and BUILTIN_REWARDS["math_exact"] is math_exact
    assert reward("3+4=", "7", "7") == 1.0 and reward("3+4=", "8", "7") == 0.0


def test_unknown_rm_type_lists_the_valid_names():
    with pytest.raises(MilesConfigError, match=r"--rm-type 'f1'.*\['math_exact'\].*--custom-rm-path"):
        get_reward_fn("f1")


def _write_module(tmp_path, body, name="my_rm.py"):
    path = tmp_path / name
    path.write_text(body)
    return path


def test_custom_reward_from_a_file_overrides_rm_type(tmp_path):
    path = _write_module(tmp_path, "def length_reward(prompt, response, label):\n    return len(response) / 10\n")
    reward = get_reward_fn("not-a-builtin", f"{path}:length_reward")
    assert reward("p", "abc", "x") == pytest.approx(0.3)
    assert type(reward("p", "abc", "x")) is float


def test_custom_reward_from_a_package_module(tmp_path, monkeypatch):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "rewards.py").write_text("def contains(prompt, response, label):\n    return label in response\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reward = get_reward_fn("math_exact", "mypkg.rewards:contains")
    assert reward("p", "the answer is 7", "7") == 1.0  # a bool counts as 0/1
    assert reward("p", "no", "7") == 0.0
    sys.modules.pop("mypkg.rewards", None)
    sys.modules.pop("mypkg", None)


@pytest.mark.parametrize(
    "spec_suffix, match",
    [
        ("", r"must be 'path/to/file\.py:func_name'"),
        (":missing", r"'missing' does not exist"),
        (":NOT_CALLABLE", r"'NOT_CALLABLE' is not callable"),
        (":two_args", r"cannot be called as two_args\(prompt, response, label\)"),
    ],
)
def test_bad_custom_specs_are_clear_errors(tmp_path, spec_suffix, match):
    body = "NOT_CALLABLE = 3\n\ndef two_args(prompt, response):\n    return 0.0\n"
    path = _write_module(tmp_path, body)
    with pytest.raises(MilesConfigError, match=match):
        get_reward_fn("math_exact", f"{path}{spec_suffix}")


def test_missing_file_and_module_are_clear_errors(tmp_path):
    with pytest.raises(MilesConfigError, match=r"no such file"):
        get_reward_fn("math_exact", f"{tmp_path}/nope.py:f")
    with pytest.raises(MilesConfigError, match=r"importing 'no_such_pkg_xyz\.mod' failed with ModuleNotFoundError"):
        get_reward_fn("math_exact", "no_such_pkg_xyz.mod:f")


def test_module_that_fails_to_import_is_a_clear_error(tmp_path):
    path = _write_module(tmp_path, "raise RuntimeError('needs a GPU')\n")
    with pytest.raises(MilesConfigError, match=r"failed with RuntimeError: needs a GPU"):
        get_reward_fn("math_exact", f"{path}:f")


def test_reward_that_raises_names_function_prompt_and_response(tmp_path):
    path = _write_module(tmp_path, "def parse(prompt, response, label):\n    return float(response) == float(label)\n")
    reward = get_reward_fn("math_exact", f"{path}:parse")
    assert reward("3+4=", "7", "7") == 1.0
    expected = r"my_rm\.py:parse raised ValueError.*prompt='3\+4=', response='7x'"
    with pytest.raises(RewardFunctionError, match=expected) as info:
        reward("3+4=", "7x", "7")
    assert isinstance(info.value, MilesConfigError)
    assert isinstance(info.value.__cause__, ValueError)


@pytest.mark.parametrize("bad_value", [math.nan, math.inf, -math.inf, "1.0", None, [1.0], 1j, np.float32("nan")])
def test_non_finite_or_non_number_results_are_rejected(bad_value):
    reward = CheckedReward(lambda prompt, response, label: bad_value, "tests.bad_reward")
    expected = r"tests\.bad_reward returned .*prompt='p', response='r'.*finite real"
    with pytest.raises(RewardFunctionError, match=expected):
        reward("p", "r", "l")


@pytest.mark.parametrize("value, expected", [(True, 1.0), (0, 0.0), (np.float64(0.25), 0.25), (-2, -2.0)])
def test_real_numbers_are_returned_as_float(value, expected):
    reward = CheckedReward(lambda prompt, response, label: value, "tests.value")
    result = reward("p", "r", "l")
    assert result == expected and type(result) is float


def test_long_prompts_are_shortened_in_errors():
    reward = CheckedReward(lambda prompt, response, label: math.nan, "tests.nan")
    with pytest.raises(RewardFunctionError) as info:
        reward("x" * 10_000, "r", "l")
    assert len(str(info.value)) < 800


# ---------------------------------------------------------------- upstream's form: reward_func(args, sample)

UPSTREAM_REWARDS = '''
import asyncio

calls = []


async def reward_func(args, sample, **kwargs):
    calls.append(sample.index)
    await asyncio.sleep(0)  # a real coroutine: awaited, not just called
    return float(sample.response.strip() == sample.label["ground_truth"]) * args.scale


def plain(args, sample):
    return len(sample.response)


async def raises(args, sample):
    raise KeyError("ground_truth")


def three(prompt, response, label):
    return 1.0
'''


def _samples(labels, responses):
    from miles.utils.types import Sample

    return [Sample(group_index=0, index=i, prompt="3+4=", label=label, tokens=[], response_length=0, response=r)
            for i, (label, r) in enumerate(zip(labels, responses, strict=True))]


@pytest.fixture
def upstream_rewards(importable_module):
    return importable_module("upstream_rewards", UPSTREAM_REWARDS)


def test_an_upstream_async_reward_gets_args_and_the_sample_with_its_dict_label(upstream_rewards):
    from types import SimpleNamespace

    reward = get_reward_fn("math_exact", f"{upstream_rewards}.reward_func")
    samples = _samples([{"ground_truth": "7"}] * 3, ["7", " 8", "7 "])
    assert reward.score(SimpleNamespace(scale=2.0), samples) == [2.0, 0.0, 2.0]
    assert sys.modules[upstream_rewards].calls == [0, 1, 2]
    plain = get_reward_fn("math_exact", f"{upstream_rewards}.plain")  # a plain function's number is taken as is
    assert plain.score(None, samples) == [1.0, 2.0, 2.0]


def test_miles_form_still_gets_the_label_as_text(upstream_rewards):
    seen = []
    reward = CheckedReward(lambda prompt, response, label: seen.append(label) or 1.0, "tests.text")
    assert reward.score(None, _samples([7, {"ground_truth": "7"}, "7"], ["7", "7", "7"])) == [1.0, 1.0, 1.0]
    assert seen == ["7", '{"ground_truth": "7"}', "7"]
    assert get_reward_fn().score(None, _samples([7], ["7"])) == [1.0]  # the built-in compares with the text


def test_upstream_form_errors_name_the_function_the_sample_and_the_fix(upstream_rewards):
    reward = get_reward_fn("math_exact", f"{upstream_rewards}.raises")
    with pytest.raises(RewardFunctionError, match=r"upstream_rewards\.raises raised KeyError.*prompt='3\+4='"):
        reward.score(None, _samples([{}], ["7"]))
    with pytest.raises(MilesConfigError, match=r"upstream's form, async def three\(args, sample.*package\.module:three"):
        get_reward_fn("math_exact", f"{upstream_rewards}.three")
    with pytest.raises(MilesConfigError, match=r"--custom-rm-path .*cannot be imported"):
        get_reward_fn("math_exact", "no_such_pkg_xyz.reward_func")


def test_the_shipped_upstream_form_example_scores_string_and_dict_labels():
    reward = get_reward_fn("math_exact", "examples.custom_generate.reward.reward_func")
    samples = _samples(["7", {"ground_truth": "7"}, {"ground_truth": "8"}, 7], ["7", " 7", "7", "7<eos>"])
    assert reward.score(None, samples) == [1.0, 1.0, 0.0, 0.0]  # "7<eos>" is not "7": responses come decoded


def test_an_upstream_reward_called_alone_takes_args_and_a_sample(upstream_rewards):
    from types import SimpleNamespace

    reward = get_reward_fn("math_exact", f"{upstream_rewards}.reward_func")
    assert reward(SimpleNamespace(scale=1.0), _samples([{"ground_truth": "7"}], ["7"])[0]) == 1.0
