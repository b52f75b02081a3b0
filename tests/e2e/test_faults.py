"""Faults at run time end in one line and keep the work done: divergence, SIGINT/SIGTERM, a dead process."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

import miles.ray.run
import train
from miles.backends import train_process
from miles.backends.training_utils import checkpoint
from miles.tracking.metrics import read_metrics
from miles.utils.cli import run_cli
from tests.e2e.conftest import SMALL_RUN

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
REPO_ROOT = Path(__file__).resolve().parents[2]


def _run_cli(capsys, args) -> tuple[int, str]:
    with pytest.raises(SystemExit) as caught:
        run_cli(lambda: train.train(args))
    return caught.value.code, capsys.readouterr().err


def test_a_diverging_run_stops_with_one_line_and_keeps_the_last_finite_rollout(make_args, tmp_path, capsys):
    """An Adam step of 1e10 ruins the weights. Where the non-finite number shows first (the engine's sampling, a
    loss, a gradient norm, the pushed weights) depends on the CPU's arithmetic, so the test asserts what holds on
    every path: one line naming the rollout and the fix, the rollouts before it logged, and the last of them
    saved and named for the resume."""
    save = tmp_path / "ckpt"
    args = make_args("--lr", "1e10", "--save", str(save), "--save-interval", "10")
    status, err = _run_cli(capsys, args)
    assert status == 1 and "Traceback" not in err and "bug in miles" not in err
    last = err.splitlines()[-1]
    stopped = re.fullmatch(r"error: (?:rollout (\d+)\b.*|weight version \d+): .*the training diverged: lower --lr, "
                           r".*\. (.*)", last)
    assert stopped, last
    logged = [record["rollout_id"] for record in read_metrics(args.log_dir)]
    finished = len(logged)  # rollout 0 starts from finite weights; the run does not reach its end
    assert logged == list(range(finished)) and 1 <= finished < args.num_rollout, (logged, last)
    assert stopped[1] is None or int(stopped[1]) == finished, last  # the line names the rollout that diverged
    assert checkpoint.latest_rollout_id(str(save)) == finished - 1
    assert stopped[2] == f"Saved rollout {finished - 1} in {save}; resume with --load {save}."


class PolicyTrainer(train_process.PolicyTrainer):  # the same class name, as Ray reports it for a real actor
    """An actor whose process dies (as if killed) in the middle of training rollout 2."""

    def train(self, rollout_id: int):
        if rollout_id == 2:
            os._exit(9)
        return super().train(rollout_id)


def test_a_dead_actor_is_one_line_naming_its_role_and_the_latest_checkpoint(make_args, tmp_path, capsys, monkeypatch):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import this test module
    monkeypatch.setattr(miles.ray.run, "PolicyTrainer", PolicyTrainer)
    save = tmp_path / "ckpt"
    status, err = _run_cli(capsys, make_args("--save", str(save), "--save-interval", "1"))
    assert status == 1 and "Traceback" not in err
    assert err.splitlines()[-1] == (
        "error: the actor (policy trainer) process died after rollout 1; the run stopped. The latest checkpoint is "
        f"rollout 1 in {save}; resume with --load {save}."
    )


def _descendants(pid: int) -> set[int]:
    children = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        children |= {int(child) for child in (task / "children").read_text().split()}
    return children.union(*(_descendants(child) for child in children)) if children else children


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z":
                alive.add(pid)
        except (FileNotFoundError, IndexError):
            pass
    return alive


@pytest.mark.parametrize("driver, signum, status", [("train.py", signal.SIGTERM, 143),
                                                    ("train_async.py", signal.SIGINT, 130)])
def test_a_signal_stops_after_the_rollout_in_progress_saves_it_and_load_resumes(
    make_args, embedded_cache, tmp_path, driver, signum, status
):
    save, log_dir = tmp_path / "ckpt", tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "MILES_CACHE_DIR": str(Path(embedded_cache.checkpoint_dir).parents[1])}
    env.pop("RAY_ADDRESS", None)  # its own local cluster, as a user's run would start
    command = [sys.executable, driver, *SMALL_RUN, "--num-rollout", "1000", "--advantage-estimator", "grpo",  # as the resume
               "--save", str(save), "--save-interval", "10", "--log-dir", str(log_dir)]
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    deadline = time.monotonic() + 180
    while not ((log_dir / "metrics.jsonl").is_file() and len((log_dir / "metrics.jsonl").read_text().splitlines()) >= 2):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.2)
    ray_processes = _descendants(process.pid)
    process.send_signal(signum)
    _, err = process.communicate(timeout=120)

    finished = [record["rollout_id"] for record in read_metrics(str(log_dir))]
    name = signal.Signals(signum).name
    assert process.returncode == status, err
    assert "Traceback" not in err and "SIGTERM received at" not in err and "***" not in err, err
    assert err.splitlines()[-1] == (f"stopped: {name} received: stopped after rollout {finished[-1]}. Saved rollout "
                                    f"{finished[-1]} in {save}; resume with --load {save}.")
    assert finished == list(range(len(finished))) and len(finished) < 1000
    assert checkpoint.latest_rollout_id(str(save)) == finished[-1]
    assert (log_dir / "summary.json").is_file()
    deadline = time.monotonic() + 30
    while _alive(ray_processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(ray_processes)

    resumed = make_args("--load", str(save), "--num-rollout", str(finished[-1] + 2), "--log-dir", str(tmp_path / "r"))
    train.train(resumed)
    assert [record["rollout_id"] for record in read_metrics(resumed.log_dir)] == [finished[-1] + 1]
