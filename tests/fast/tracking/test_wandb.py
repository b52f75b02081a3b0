"""wandb through the MetricsTracker, offline: the run's .wandb file holds the same numbers as metrics.jsonl, a
failing wandb never fails the run, and the mode follows the flags, the environment and the key."""

import logging
import math

import pytest

from miles.tracking.metrics import MetricsTracker, read_metrics
from miles.tracking.wandb_run import WandbSettings
from miles.utils.arguments import parse_args
from tests.wandb_records import history


def _settings(**overrides) -> WandbSettings:
    values = dict(project="p", group="g", team=None, key=None, host=None, run_id=None, mode=None, dir=None,
                  random_suffix=True)
    values.update(overrides)
    return WandbSettings(**values)


ROLLOUTS = [
    {"rollout/reward_mean": 0.25, "train/lr": 0.0, "off_policy/correction": "tis", "rollout/num_samples": 16},
    {"rollout/reward_mean": math.nan, "train/lr": 1e-4, "off_policy/correction": "tis", "rollout/num_samples": 16},
    {"rollout/reward_mean": 0.5, "train/lr": 2e-4, "eval/accuracy": 0.125, "off_policy/correction": "tis",
     "rollout/num_samples": 16},
]


def test_an_offline_run_in_the_run_folder_has_the_jsonl_numbers(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "run"
    with MetricsTracker(str(run_dir), False, 3, 0, {"lr": 3e-4, "wandb_key": None}, "train",
                        wandb=_settings()) as tracker:
        for rollout_id, metrics in enumerate(ROLLOUTS):
            tracker.log(rollout_id, metrics)
    rows, config = history(run_dir)
    assert config["lr"] == 3e-4
    jsonl = read_metrics(run_dir)
    assert [row["_step"] for row in rows] == [record["rollout_id"] for record in jsonl] == [0, 1, 2]
    for row, record in zip(rows, jsonl, strict=True):
        numbers = {name: value for name, value in record.items()
                   if name not in ("rollout_id", "time") and isinstance(value, (int, float))}
        logged = {name: value for name, value in row.items() if not name.startswith("_")}
        assert set(logged) == set(numbers) | ({"rollout/reward_mean"} if record["rollout_id"] == 1 else set())
        for name, value in numbers.items():
            assert logged[name] == value, name  # the JSON text of one float: exact
    assert math.isnan(rows[1]["rollout/reward_mean"])  # null in the JSONL, NaN (seen, not hidden) in wandb


def test_a_key_is_never_written_to_the_config(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    with MetricsTracker(str(tmp_path / "run"), False, 1, 0, {"wandb_key": "secret-123"}, "train",
                        wandb=_settings()) as tracker:
        tracker.log(0, {"train/lr": 1.0})
    assert "secret-123" not in (tmp_path / "run" / "config.json").read_text()
    rows, config = history(tmp_path / "run")
    assert config["wandb_key"] == "<redacted>"


def test_a_wandb_that_cannot_start_never_stops_the_run(tmp_path, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING), MetricsTracker(
            str(tmp_path / "run"), False, 1, 0, {}, "train",
            wandb=_settings(mode="offline", dir=str(blocker / "wandb"))) as tracker:
        tracker.log(0, {"train/lr": 1.0})
    assert read_metrics(tmp_path / "run")[0]["train/lr"] == 1.0
    assert "the run goes on without wandb" in caplog.text


@pytest.mark.parametrize(("mode", "env", "key", "expected"), [
    (None, {}, None, "offline"),  # no key, no network needed
    (None, {}, "k", "online"),
    (None, {"WANDB_API_KEY": "k"}, None, "online"),
    (None, {"WANDB_MODE": "disabled", "WANDB_API_KEY": "k"}, None, "disabled"),
    ("offline", {"WANDB_API_KEY": "k"}, "k", "offline"),
])
def test_the_mode_follows_the_flag_then_the_environment_then_the_key(monkeypatch, mode, env, key, expected):
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _settings(mode=mode, key=key).resolved_mode() == expected


def test_upstreams_flags_fill_the_settings():
    args = parse_args(argv=["--use-wandb", "--wandb-project", "p", "--wandb-group", "g", "--wandb-key", "k",
                            "--wandb-run-id", "abc", "--wandb-mode", "offline", "--disable-wandb-random-suffix"])
    assert WandbSettings.from_args(args) == _settings(key="k", run_id="abc", mode="offline", random_suffix=False)
    assert WandbSettings.from_args(parse_args(argv=[])) is None
