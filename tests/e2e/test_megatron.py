"""The megatron backend in real runs of both drivers: every mode, the runtime guard, and the same metrics as the
torch backend on a short sync run."""

import asyncio
import math

import pytest

import train
import train_async
from miles.backends.training_utils.checkpoint import load_trainer_state, rollout_dir
from miles.tracking.metrics import read_metrics
from miles.utils.arguments import parse_args
from miles.utils.errors import MilesConfigError
from miles.ray.preflight import preflight
from tests.e2e.conftest import SMALL_SETTINGS

pytestmark = [pytest.mark.e2e, pytest.mark.megatron, pytest.mark.timeout(300)]
MEGATRON = ["--train-backend", "megatron"]


def run(args, driver) -> list[dict]:
    if driver is train_async:
        asyncio.run(train_async.train(args))
    else:
        driver.train(args)
    return read_metrics(args.log_dir)


def column(records: list[dict], name: str) -> list:
    return [record[name] for record in records]


@pytest.mark.parametrize(
    ("driver", "flags", "staleness"),
    [
        (train_async, ["--advantage-estimator", "ppo", "--use-rollout-logprobs"], [0, 1, 1]),
        (train_async, ["--advantage-estimator", "ppo", "--use-tis"], [0, 1, 1]),
        (train_async, ["--advantage-estimator", "ppo", "--keep-old-actor"], [0, 1, 1]),
        (train_async, ["--advantage-estimator", "grpo"], [0, 1, 1]),
        (train, ["--advantage-estimator", "ppo", "--keep-old-actor"], [0, 0, 0]),
    ],
    ids=["async-ppo-rollout-logprobs", "async-ppo-tis", "async-ppo-keep-old-actor", "async-grpo", "sync-ppo"],
)
def test_every_mode_trains_on_megatron_and_the_guard_passes(make_args, driver, flags, staleness):
    records = run(make_args(*MEGATRON, *flags, "--num-rollout", "3"), driver)
    assert column(records, "off_policy/staleness_max") == staleness
    for record in records:
        assert math.isfinite(record["train/loss"])
        assert ("critic/value_loss" in record) == ("ppo" in flags)
        if "--keep-old-actor" in flags:  # the megatron denominator against the torch engine's log-probs
            assert record["off_policy/denominator_behavior_abs_diff_max"] <= 1e-4


def test_a_short_sync_grpo_run_has_the_torch_backends_metrics(make_args, tmp_path):
    """Same seeds, 3 rollouts: both backends generate the same first rollout and take the same steps, so every
    metric agrees to float32 rounding; 1e-4 relative catches any real difference (a wrong step moves rewards)."""
    common = ["--advantage-estimator", "grpo", "--num-rollout", "3", "--lr", "1e-3"]
    records = {backend: run(make_args("--train-backend", backend, *common, "--log-dir", str(tmp_path / backend)),
                            train)
               for backend in ("torch", "megatron")}
    names = [name for name in records["torch"][0] if name.startswith(("rollout/", "train/", "off_policy/"))
             and isinstance(records["torch"][0][name], float)]
    assert "train/grad_norm" in names and "rollout/reward_mean" in names
    for torch_record, megatron_record in zip(records["torch"], records["megatron"], strict=True):
        for name in names:
            expected, actual = torch_record[name], megatron_record[name]
            assert actual == pytest.approx(expected, rel=1e-4, abs=1e-6), name


def test_the_readme_main_job_with_no_backend_flag_trains_with_megatron(tmp_path):
    """The default launch (the README's main job at small settings, no --train-backend) trains with megatron-core:
    its checkpoint records the backend, and a resume with --train-backend torch is refused."""
    save = str(tmp_path / "save")
    argv = [*SMALL_SETTINGS, "--advantage-estimator", "ppo", "--keep-old-actor", "--num-rollout", "2",
            "--save", save, "--save-interval", "1"]
    args = parse_args(argv=[*argv, "--log-dir", str(tmp_path / "run")])
    assert args.train_backend == "megatron"
    records = run(args, train_async)
    assert column(records, "off_policy/staleness_max") == [0, 1]
    for role in ("actor", "critic"):
        assert load_trainer_state(rollout_dir(save, 1) / role)["train_backend"] == "megatron"
    with pytest.raises(MilesConfigError, match="saved with --train-backend megatron"):
        preflight(parse_args(argv=[*argv, "--train-backend", "torch", "--load", save, "--critic-load", save,
                                   "--hf-checkpoint", args.hf_checkpoint, "--prompt-data", args.prompt_data,
                                   "--eval-prompt-data", *args.eval_prompt_data, "--log-dir", str(tmp_path / "resume")]))
