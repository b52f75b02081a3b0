"""Train roles as groups of ranks in real runs: data parallelism takes the single-process steps on both backends,
a dead rank ends the run quickly and leaves nothing behind."""

import os
import signal
import threading
import time

from pathlib import Path

import pytest
import ray

import train
from miles.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
GRPO = ["--advantage-estimator", "grpo", "--num-rollout", "3", "--lr", "1e-3"]
DP2 = ["--actor-num-gpus-per-node", "2", "--micro-batch-size", "4"]  # 16 samples: 8 per rank, 2 micro-batches


def _run_sync(args) -> list[dict]:
    train.train(args)
    return read_metrics(args.log_dir)


def _assert_same_metrics(expected_records: list[dict], records: list[dict]) -> None:
    """Every logged float of rollouts, training and the off-policy report, rollout by rollout. The DP run sums
    float32 gradients and metric totals in another order than the single process: ~1e-7 relative per step, far
    inside 1e-4, while a wrong slice, divisor or reduction moves the loss, grad norm and next rollouts by far more."""
    names = [name for name, value in expected_records[0].items()
             if name.startswith(("rollout/", "train/", "off_policy/")) and isinstance(value, float)]
    assert {"train/loss", "train/grad_norm", "rollout/reward_mean", "off_policy/policy_behavior_kl"} <= set(names)
    assert len(records) == len(expected_records) == 3
    for expected, actual in zip(expected_records, records, strict=True):
        for name in names:
            assert actual[name] == pytest.approx(expected[name], rel=1e-4, abs=1e-6), (expected["rollout_id"], name)


@pytest.mark.parametrize("backend", ["torch", pytest.param("megatron", marks=pytest.mark.megatron)])
def test_two_data_parallel_ranks_log_the_single_process_metrics(make_args, tmp_path, backend):
    if backend == "megatron":
        pytest.importorskip("megatron.core")
    common = [*GRPO, "--train-backend", backend]
    single = _run_sync(make_args(*common, "--log-dir", str(tmp_path / "single")))
    data_parallel = _run_sync(make_args(*common, *DP2, "--log-dir", str(tmp_path / "dp2")))
    _assert_same_metrics(single, data_parallel)


def _rank_processes() -> list[int]:
    """Pids of live rank workers (Ray titles its worker processes ``ray::RankWorker...``)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"ray::RankWorker" in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:  # the process ended meanwhile
            continue
    return pids


def test_a_killed_rank_ends_the_run_with_an_error_and_releases_every_rank(make_args):
    """SIGKILL one actor rank while the run trains: the run fails within 60 s and no rank process is left."""
    args = make_args(*GRPO, *DP2, "--num-rollout", "200")
    killed: list[int] = []

    def kill_rank_one_once_training():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            ranks = _rank_processes()
            if len(ranks) == 2 and os.path.exists(os.path.join(args.log_dir, "metrics.jsonl")):
                os.kill(max(ranks), signal.SIGKILL)
                killed.append(time.monotonic())
            time.sleep(0.2)

    killer = threading.Thread(target=kill_rank_one_once_training, daemon=True)
    killer.start()
    with pytest.raises(Exception) as failure:
        _run_sync(args)
    ended = time.monotonic()
    killer.join()
    assert killed, "no rank was killed: the run ended before training started"
    assert ended - killed[0] < 60
    assert isinstance(failure.value, (ray.exceptions.RayActorError, ray.exceptions.RayTaskError)), failure.value
    deadline = time.monotonic() + 30
    while _rank_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _rank_processes()
