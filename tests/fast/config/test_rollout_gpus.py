"""Upstream's rollout sizing: engines = --rollout-num-gpus / --rollout-num-gpus-per-engine, --rollout-num-engines the
same number under miles' name; a tensor-parallel engine (more than one GPU each) is refused naming the range."""

import pytest

from miles.config.arguments import parse_args
from miles.utils.errors import MilesConfigError


def _sizes(*words):
    args = parse_args(argv=list(words))
    return args.rollout_num_engines, args.rollout_num_gpus, args.rollout_num_gpus_per_engine


@pytest.mark.parametrize(
    ("words", "sizes"),
    [([], (1, 1, 1)),  # neither given: one engine of one "GPU"
     (["--rollout-num-gpus", "3"], (3, 3, 1)),
     (["--rollout-num-gpus", "2", "--rollout-num-gpus-per-engine", "1"], (2, 2, 1)),  # the public launchers' words
     (["--rollout-num-engines", "2"], (2, 2, 1)),
     (["--rollout-num-engines", "2", "--rollout-num-gpus", "2"], (2, 2, 1))],  # both, agreeing
)
def test_engines_are_the_quotient_and_the_two_names_fill_each_other(words, sizes):
    assert _sizes(*words) == sizes


def test_the_derived_count_is_recorded_with_its_source():
    args = parse_args(argv=["--rollout-num-gpus", "2"])
    assert "rollout_num_engines = 2 (--rollout-num-gpus / --rollout-num-gpus-per-engine)" in args.derived


@pytest.mark.parametrize(
    ("words", "message"),
    [(["--rollout-num-gpus-per-engine", "2"],
      "--rollout-num-gpus-per-engine is 2, but it must be >= 1 and <= 1 (each engine is one process: tensor-parallel engines "
      "are not implemented)"),
     (["--rollout-num-engines", "3", "--rollout-num-gpus", "2"],
      "--rollout-num-engines 3 contradicts --rollout-num-gpus 2 / --rollout-num-gpus-per-engine 1 = 2 engines"),
     (["--rollout-num-gpus", "0"], "--rollout-num-gpus is 0, but it must be >= 1"),
     (["--num-gpus-per-node", "0"], "--num-gpus-per-node is 0, but it must be >= 1")],
)
def test_sizes_miles_cannot_run_stop_in_one_line_naming_the_value(words, message):
    with pytest.raises(MilesConfigError) as error:
        parse_args(argv=words)
    assert message in str(error.value) and "\n" not in str(error.value)
