"""Every numeric flag has a range, checked by parse_args before anything else (miles/config/flag_rules.py)."""

import math

import pytest

from miles.utils.arguments import build_parser, parse_args
from miles.utils.errors import MilesConfigError
from miles.config.flag_rules import FLAG_RULES, PATH_FLAGS, SEED_MAX, Range, flag_name


def _numeric_actions() -> dict[str, type]:
    return {action.dest: action.type for action in build_parser()._actions if action.type in (int, float)}


def test_every_numeric_flag_has_a_rule_and_every_rule_a_flag():
    assert set(_numeric_actions()) == set(FLAG_RULES)


def test_every_path_flag_exists():
    dests = {action.dest for action in build_parser()._actions}
    assert set(PATH_FLAGS) <= dests


@pytest.mark.parametrize("dest", sorted(FLAG_RULES))
def test_each_rule_s_example_is_a_value_it_accepts(dest):
    example = FLAG_RULES[dest].example
    assert FLAG_RULES[dest].holds(_numeric_actions()[dest](example))


FLOAT_FLAGS = sorted(dest for dest, kind in _numeric_actions().items() if kind is float)


@pytest.mark.parametrize("dest", FLOAT_FLAGS)
def test_nan_is_refused_by_every_float_flag(dest):
    flag = flag_name(dest)
    with pytest.raises(MilesConfigError, match=f"^{flag} is nan, but it must be .*Pass e.g. {flag} "):
        parse_args(argv=[flag, "nan"])


@pytest.mark.parametrize("dest", FLOAT_FLAGS)
def test_inf_is_refused_unless_the_rule_gives_it_a_meaning(dest):
    argv = [flag_name(dest), "inf"]
    if FLAG_RULES[dest].allow_inf:
        companions = {"tis_clip": ["--tis-clip-low", "0"], "rs_upper_bound": ["--use-tis", "--rs-level", "geometric"]}
        parse_args(argv=argv + companions.get(dest, []))
    else:
        with pytest.raises(MilesConfigError, match=f"^{flag_name(dest)} is inf, but it must be .*finite"):
            parse_args(argv=argv)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--eps-clip=-0.1"], "--eps-clip is -0.1, but it must be > 0 and < 1 and finite (the ratio is clipped"),
        (["--eps-clip", "nan"], "--eps-clip is nan"),  # named as itself, not as the --eps-clip-high it fills
        (["--eps-clip", "1"], "--eps-clip is 1.0"),
        (["--eps-clip-high", "0"], "--eps-clip-high is 0.0, but it must be > 0 and finite"),
        (["--entropy-coef", "nan"], "--entropy-coef is nan"),
        (["--entropy-coef=-0.01"], "--entropy-coef is -0.01, but it must be >= 0"),
        (["--lr=-1"], "--lr is -1.0, but it must be >= 0 and finite (0 freezes the actor; Adam refuses a negative "
                      "rate). Pass e.g. --lr 3e-4."),
        (["--lr", "nan"], "--lr is nan"),
        (["--lr", "inf"], "--lr is inf"),
        (["--critic-lr=-1e-5"], "--critic-lr is -1e-05"),
        (["--seed", "99999999999999999999"], f"--seed is 99999999999999999999, but it must be >= 0 and <= {SEED_MAX}"),
        (["--seed=-1"], "--seed is -1"),
        (["--seed", "1" + "0" * 400], "--seed is 1000"),  # larger than any float: still one clean error
        (["--rollout-seed", str(SEED_MAX + 1)], f"--rollout-seed is {SEED_MAX + 1}"),
        (["--start-rollout-id=-1"], "--start-rollout-id is -1, but it must be >= 0 (rollout ids count from 0)"),
        (["--ray-placement-timeout", "nan"], "--ray-placement-timeout is nan, but it must be > 0 and finite"),
        (["--ray-placement-timeout", "0"], "--ray-placement-timeout is 0.0"),
        (["--gamma", "1.5"], "--gamma is 1.5, but it must be >= 0 and <= 1"),
        (["--clip-grad", "0"], "--clip-grad is 0.0, but it must be > 0 and may be inf"),
        (["--num-rollout", "0"], "--num-rollout is 0, but it must be >= 1. Pass e.g. --num-rollout 1."),
        (["--eval-interval=-1"], "--eval-interval is -1"),
    ],
)
def test_values_out_of_range_are_refused_with_the_value_the_rule_and_a_fix(argv, message):
    with pytest.raises(MilesConfigError) as caught:
        parse_args(argv=argv)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(
    "argv",
    [
        ["--lr", "1e10"],  # a value, not an error: a run that diverges with it is stopped at run time
        ["--lr", "0"],
        ["--seed", str(SEED_MAX)],
        ["--seed", "0"],
        ["--start-rollout-id", "0", "--num-rollout", "5"],
        ["--clip-grad", "inf"],
        ["--gamma", "0", "--lambd", "1"],
        ["--eval-interval", "0"],
        ["--eps-clip", "0.1", "--eps-clip-high", "5"],
    ],
)
def test_values_in_range_are_accepted(argv):
    parse_args(argv=argv)


@pytest.mark.parametrize("dest", PATH_FLAGS)
def test_an_empty_path_is_refused(dest):
    flag = flag_name(dest)
    with pytest.raises(MilesConfigError, match=f"^{flag} is '', an empty path, .* leave {flag} out"):
        parse_args(argv=[f"{flag}="])


def test_range_edges_open_and_closed():
    closed = Range(low=0, high=1)
    assert closed.holds(0) and closed.holds(1) and not closed.holds(-1e-12) and not closed.holds(1 + 1e-12)
    half_open = Range(low=0, high=1, low_open=True, high_open=True)
    assert not half_open.holds(0) and not half_open.holds(1) and half_open.holds(0.5)
    assert not Range(low=0).holds(math.inf) and Range(low=0, allow_inf=True).holds(math.inf)
    assert not Range(low=0, allow_inf=True).holds(-math.inf) and not Range().holds(math.nan)
