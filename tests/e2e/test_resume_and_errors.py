"""Checkpoints and resume; bad input gets a clear error and nothing half-written."""

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import torch
from safetensors.torch import load_file

import train
import train_async
from miles.backends.training_utils import checkpoint
from miles.backends.train_process import PolicyTrainer
from miles.ray.run import resolve_run_paths
from miles.tracking.metrics import read_metrics
from miles.utils.errors import MilesConfigError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
REPO_ROOT = Path(__file__).resolve().parents[2]


def _resumable_args(make_args, save: Path, log_dir: Path, num_rollout: int):
    return make_args("--advantage-estimator", "ppo", "--keep-old-actor", "--save", str(save), "--save-interval", "1",
                     "--load", str(save), "--num-rollout", str(num_rollout), "--log-dir", str(log_dir))


def test_resume_continues_rollouts_versions_weights_and_optimizer(make_args, tmp_path):
    save = tmp_path / "ckpt"
    first = read_metrics_after_async(_resumable_args(make_args, save, tmp_path / "first", 3))
    assert checkpoint.latest_rollout_id(str(save)) == 2
    saved_dir = checkpoint.rollout_dir(str(save), 2) / "actor"
    saved_state = checkpoint.load_trainer_state(saved_dir)
    saved_weights = load_file(saved_dir / "model.safetensors")

    # What a resumed actor holds equals what was saved (weights and optimizer state).
    args = _resumable_args(make_args, save, tmp_path / "probe", 5)
    resolve_run_paths(args, "test")
    probe = ray.remote(PolicyTrainer).options(num_cpus=1).remote(args, 1)
    assert ray.get(probe.init.remote()) == 3
    loaded = ray.get(probe.model_and_optimizer_state.remote())
    ray.kill(probe)
    for name, tensor in saved_weights.items():
        assert torch.equal(loaded["model"][name], tensor), name
    for param_id, param_state in saved_state["optimizer"]["state"].items():
        for key, value in param_state.items():
            assert torch.equal(loaded["optimizer"]["state"][param_id][key], value), (param_id, key)

    # Two resumes from the same checkpoint: rollout 3 continues the version count and is reproducible. The checkpoint
    # is its run's last rollout, with no rollout in flight, so these resumes are not exact (test_exact_resume.py):
    # they generate rollout 3 with the loaded weights and push them as a new version.
    resumed = [read_metrics_after_async(_resumable_args(make_args, _copy(save, tmp_path / f"c{i}"), tmp_path / f"r{i}", 4))
               for i in range(2)]
    for records in resumed:
        assert [r["rollout_id"] for r in records] == [3]
        assert records[0]["rollout/weight_version"] == saved_state["weight_version"] + 1
        assert records[0]["off_policy/staleness_max"] == 0  # d(s) = 0 at the resumed start, as the note says
    for name in ["rollout/reward_mean", "rollout/response_length_mean", "train/pg_loss", "critic/value_loss"]:
        assert resumed[0][0][name] == resumed[1][0][name], name
    assert first[-1]["rollout_id"] == 2


def read_metrics_after_async(args):
    asyncio.run(train_async.train(args))
    return read_metrics(args.log_dir)


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def test_missing_hf_checkpoint_is_a_clear_error_before_anything_is_written(make_args, tmp_path):
    args = make_args("--hf-checkpoint", str(tmp_path / "nope"))
    with pytest.raises(MilesConfigError, match="--hf-checkpoint"):
        train.train(args)
    assert not Path(args.log_dir).exists()


@pytest.mark.parametrize("content, words", [("", "no prompts"), ('{"prompt": "1+1=", "label": "2"}\n{oops\n', "line 2")])
def test_bad_prompt_file_is_a_clear_error_before_anything_is_written(make_args, tmp_path, content, words):
    data = tmp_path / "prompts.jsonl"
    data.write_text(content)
    args = make_args("--prompt-data", str(data))
    with pytest.raises(MilesConfigError, match=words):
        train.train(args)
    assert not Path(args.log_dir).exists()


@pytest.mark.parametrize("body, words", [("raise RuntimeError('boom')", "boom"), ("return float('nan')", "nan")])
def test_bad_reward_function_stops_the_run_with_a_clear_error(make_args, tmp_path, body, words):
    reward_file = tmp_path / "reward.py"
    reward_file.write_text(f"def reward(prompt, response, label):\n    {body}\n")
    args = make_args("--custom-rm-path", f"{reward_file}:reward")
    with pytest.raises(MilesConfigError) as caught:
        train.train(args)
    assert words in str(caught.value).lower()


def test_unsatisfiable_placement_fails_within_the_timeout(make_args):
    args = make_args("--rollout-num-engines", "16", "--ray-placement-timeout", "2")
    with pytest.raises(MilesConfigError, match="could not place them"):
        train.train(args)


def test_cli_prints_run_time_config_errors_without_traceback(tmp_path, embedded_cache):
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "MILES_CACHE_DIR": str(Path(embedded_cache.checkpoint_dir).parents[1])}
    result = subprocess.run(
        [sys.executable, "train.py", "--prompt-data", str(data), "--log-dir", str(tmp_path / "run")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=env,
    )
    assert result.returncode == 2, result.stderr
    assert "error: --prompt-data" in result.stderr and "Traceback" not in result.stderr
