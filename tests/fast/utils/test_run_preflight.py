"""What training_run checks in the driver process before Ray starts."""

import pytest

from miles.backends.training_utils import checkpoint
from miles.ray.run import check_rollouts_left, preflight
from miles.utils.arguments import parse_args
from miles.utils.errors import MilesConfigError


def test_resuming_a_finished_run_is_refused_before_ray_starts(tmp_path):
    checkpoint.mark_latest(str(tmp_path), 9)
    with pytest.raises(MilesConfigError, match=r"start at rollout 10 \(--load .* holds rollout 9\), but --num-rollout is 10"):
        check_rollouts_left(parse_args(argv=["--load", str(tmp_path), "--num-rollout", "10"]))
    check_rollouts_left(parse_args(argv=["--load", str(tmp_path), "--num-rollout", "11"]))  # one left: fine
    check_rollouts_left(parse_args(argv=["--load", str(tmp_path / "empty"), "--num-rollout", "1"]))  # fresh start


def test_an_explicit_start_beyond_the_last_rollout_is_refused():
    with pytest.raises(MilesConfigError, match="start at rollout 5, but --num-rollout is 5"):
        check_rollouts_left(parse_args(argv=["--start-rollout-id", "5", "--num-rollout", "5"]))


def test_a_bad_eval_file_is_named_as_the_eval_flag(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text('{"prompt": "1+1=", "label": "2"}\n')
    hf = tmp_path / "model"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    args = parse_args(argv=["--hf-checkpoint", str(hf), "--prompt-data", str(train),
                            "--eval-prompt-data", str(tmp_path / "missing.jsonl")])
    with pytest.raises(MilesConfigError, match="^--eval-prompt-data .*missing.jsonl"):
        preflight(args)
    args.eval_prompt_data = None
    assert preflight(args) == 1  # the number of training prompts
