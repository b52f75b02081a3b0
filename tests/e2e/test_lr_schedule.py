"""Upstream's flags in real runs: Megatron's optimizer and schedule on both backends (the rate in metrics.jsonl
follows the schedule, actor and critic, and a resumed run continues it exactly), and wandb offline (the run's
.wandb file has metrics.jsonl's numbers). One run serves both, to keep CI short."""

import math

import pytest

import train
from miles.backends.training_utils import checkpoint
from miles.tracking.metrics import read_metrics
from tests.wandb_records import history

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

LR, CRITIC_LR, WARMUP, ROLLOUTS, STEPS = 1e-3, 2e-3, 5, 6, 2
SCHEDULE = ["--advantage-estimator", "ppo", "--weight-decay", "0.1", "--adam-beta2", "0.98", "--lr-decay-style",
            "cosine", "--lr-warmup-iters", str(WARMUP), "--lr", str(LR), "--critic-lr", str(CRITIC_LR),
            "--num-rollout", str(ROLLOUTS), "--num-steps-per-rollout", str(STEPS)]


def expected_rate(iteration: int, peak: float, warmup: int, total: int = ROLLOUTS * STEPS) -> float:
    """Written out independently of miles: linear warm-up from 0, then half a cosine from peak to 0 over the rest."""
    if warmup and iteration <= warmup:
        return peak * iteration / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (iteration - warmup) / (total - warmup)))


def last_step_of(rollout_id: int) -> int:
    return rollout_id * STEPS + STEPS - 1  # train/lr is the rate of the rollout's last optimizer step


def check_rates(records: list[dict], rollout_ids: range) -> None:
    assert [r["rollout_id"] for r in records] == list(rollout_ids)
    for record in records:
        k = last_step_of(record["rollout_id"])
        assert record["train/lr"] == pytest.approx(expected_rate(k, LR, WARMUP), rel=1e-12, abs=1e-15)
        assert record["critic/lr"] == pytest.approx(expected_rate(k, CRITIC_LR, 0), rel=1e-12, abs=1e-15)
        assert math.isfinite(record["train/loss"])


def check_wandb_has_the_jsonl_numbers(run_dir) -> None:
    rows, config = history(run_dir)
    assert config["lr"] == LR and config["wandb_project"] == "p"
    records = read_metrics(run_dir)
    assert [row["_step"] for row in rows] == [record["rollout_id"] for record in records]
    for row, record in zip(rows, records, strict=True):
        numbers = {name: value for name, value in record.items()
                   if name not in ("rollout_id", "time") and isinstance(value, (int, float))}
        assert {name: row[name] for name in numbers} == numbers  # the same JSON numbers: exact
        assert not set(row) - set(numbers) - {"_step", "_runtime", "_timestamp"}


@pytest.mark.megatron
def test_the_logged_rate_follows_the_schedule_on_megatron(make_args):
    args = make_args(*SCHEDULE, "--train-backend", "megatron")
    train.train(args)
    check_rates(read_metrics(args.log_dir), range(ROLLOUTS))


def test_the_rate_follows_the_schedule_on_torch_and_a_resume_continues_it_exactly(make_args, tmp_path, monkeypatch):
    """The torch backend's whole schedule, in two legs: rollouts 0-2, saved, then 3-5 resumed from the save. The
    first leg also logs to wandb, with no key and no WANDB_MODE: offline, into the run folder."""
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    save = tmp_path / "ckpt"
    first = make_args(*SCHEDULE, "--save", str(save), "--debug-exit-after-rollout", "2",
                      "--log-dir", str(tmp_path / "first"), "--use-wandb", "--wandb-project", "p")
    train.train(first)
    check_rates(read_metrics(first.log_dir), range(3))
    check_wandb_has_the_jsonl_numbers(first.log_dir)
    state = checkpoint.load_trainer_state(checkpoint.rollout_dir(str(save), 2) / "actor")
    assert state["optimizer_steps"] == 3 * STEPS

    resumed = make_args(*SCHEDULE, "--load", str(save), "--log-dir", str(tmp_path / "resumed"))
    train.train(resumed)
    check_rates(read_metrics(resumed.log_dir), range(3, ROLLOUTS))
