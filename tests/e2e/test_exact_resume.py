"""An async run stopped and resumed with --load is the straight run: for rollouts after the stop it logs the same
metrics (every metric but times, rates and memory), and it trains the same prompts, none skipped or repeated.

Each case is a straight run of 6 rollouts that saves at rollout 2 (--save-interval 3) and a resume from that
checkpoint to 6; the SIGTERM cases stop a second run with a real SIGTERM to the driver's process at a rollout the
test picks, then resume it. A reward function that records every prompt it scores gives the prompts each run
generated (the resumed run generates no prompt twice: the rollout in flight at the save is carried, not redone).
"""

import asyncio
import math
import os
import signal
import textwrap

import pytest

import train_async
from miles.backends.training_utils import checkpoint
from miles.ray.run import TrainingRun
from miles.tracking.metrics import read_metrics
from miles.utils.arguments import parse_args
from miles.utils.errors import RunInterrupted
from tests.e2e.conftest import SMALL_SETTINGS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

CORRECTIONS = {
    "keep-old-actor": ["--advantage-estimator", "ppo", "--keep-old-actor"],
    "use-tis": ["--advantage-estimator", "ppo", "--use-tis"],
    "use-rollout-logprobs": ["--advantage-estimator", "ppo", "--use-rollout-logprobs"],
    "grpo": ["--advantage-estimator", "grpo"],
}
NUM_ROLLOUT, SAVED_ROLLOUT = 6, 2
# The full matrix on the torch backend; on megatron (its train processes start slower) one PPO correction at each
# interval, with the snapshot store at interval 2 (a save between pushes: the engines' weights are in the checkpoint).
CASES = [pytest.param("torch", name, interval, id=f"torch-{name}-N{interval}")
         for name in CORRECTIONS for interval in (1, 2)]
CASES += [pytest.param("megatron", name, interval, id=f"megatron-{name}-N{interval}", marks=pytest.mark.megatron)
          for name, interval in (("keep-old-actor", 2), ("use-tis", 1))]
# (correction, interval, the rollout after which SIGTERM stops the run): mid-interval and at a push, early and late.
SIGTERM_CASES = [("keep-old-actor", 1, 3), ("use-tis", 2, 2), ("use-rollout-logprobs", 2, 1), ("grpo", 1, 2)]
# Not compared: wall-clock times, rates and memory (perf/*), and the record's timestamp.
UNCOMPARED = ("perf/", "time")

RECORDING_REWARD = """
from miles.rollout.rm import math_exact

def reward(prompt, response, label):
    with open({path!r}, "a") as log:
        log.write(prompt.replace("\\n", " ") + "\\n")
    return math_exact(prompt, response, label)
"""


def _argv(tmp_path, backend: str, name: str, interval: int, tag: str) -> list[str]:
    reward = tmp_path / f"reward_{tag}.py"
    reward.write_text(textwrap.dedent(RECORDING_REWARD.format(path=str(tmp_path / f"prompts_{tag}.txt"))))
    return ["--train-backend", backend, *SMALL_SETTINGS, "--num-rollout", str(NUM_ROLLOUT),
            "--update-weights-interval", str(interval), *CORRECTIONS[name], "--custom-rm-path", f"{reward}:reward",
            "--log-dir", str(tmp_path / tag)]


def _run(argv: list[str]) -> list[dict]:
    args = parse_args(argv=argv)
    asyncio.run(train_async.train(args))
    return read_metrics(args.log_dir)


def _scored_prompts(tmp_path, tag: str) -> list[str]:
    return (tmp_path / f"prompts_{tag}.txt").read_text().splitlines()


def _assert_same_metrics(expected: list[dict], actual: list[dict]) -> None:
    """Rollout by rollout, the same metric names and values: equal, or within 1e-12 relative (NaN equals NaN)."""
    assert [r["rollout_id"] for r in actual] == [r["rollout_id"] for r in expected]
    for want, got in zip(expected, actual, strict=True):
        names = sorted(name for name in want if not name.startswith(UNCOMPARED))
        assert sorted(name for name in got if not name.startswith(UNCOMPARED)) == names, want["rollout_id"]
        for name in names:
            a, b = want[name], got[name]
            same = a == b or (isinstance(a, float) and isinstance(b, float) and (
                (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)))
            assert same, f"rollout {want['rollout_id']}, {name}: straight {a!r}, resumed {b!r}"


@pytest.mark.parametrize(("backend", "name", "interval"), CASES)
def test_a_resume_from_a_save_interval_checkpoint_continues_the_straight_run(
    backend, name, interval, tmp_path, embedded_cache, ray_cluster
):
    save = ["--save", str(tmp_path / "ckpt"), "--save-interval", "3"]
    straight = _run(_argv(tmp_path, backend, name, interval, "straight") + save)
    assert checkpoint.latest_rollout_id(str(tmp_path / "ckpt")) == NUM_ROLLOUT - 1
    checkpoint.mark_latest(str(tmp_path / "ckpt"), SAVED_ROLLOUT)  # resume from the save in the middle
    resumed = _run(_argv(tmp_path, backend, name, interval, "resumed") + save + ["--load", str(tmp_path / "ckpt")])

    _assert_same_metrics(straight[SAVED_ROLLOUT + 1:], resumed)
    stale = [r["off_policy/staleness_max"] for r in straight]
    assert stale == ([0, 1, 1, 1, 1, 1] if interval == 1 else [0, 1, 2, 1, 2, 1])  # d(k) from the original start
    # The straight run scored rollouts 0-5, the resumed one only 4 and 5: rollout 3 was carried in the checkpoint.
    per_rollout = len(_scored_prompts(tmp_path, "straight")) // NUM_ROLLOUT
    assert _scored_prompts(tmp_path, "resumed") == _scored_prompts(tmp_path, "straight")[4 * per_rollout:]


@pytest.mark.parametrize(("name", "interval", "stop_after"), SIGTERM_CASES)
def test_a_resume_after_sigterm_continues_the_straight_run(
    name, interval, stop_after, tmp_path, embedded_cache, ray_cluster, monkeypatch
):
    straight = _run(_argv(tmp_path, "torch", name, interval, "straight"))
    finish_rollout = TrainingRun.finish_rollout

    def finish_with_sigterm(run, rollout_id, metrics):
        if rollout_id == stop_after:  # the driver's own handler receives it, as from `kill` or a scheduler
            os.kill(os.getpid(), signal.SIGTERM)
        finish_rollout(run, rollout_id, metrics)

    save = ["--save", str(tmp_path / "ckpt"), "--load", str(tmp_path / "ckpt")]  # relaunched as is, as a job would be
    monkeypatch.setattr(TrainingRun, "finish_rollout", finish_with_sigterm)
    with pytest.raises(RunInterrupted, match=f"SIGTERM received: stopped after rollout {stop_after}. Saved"):
        _run(_argv(tmp_path, "torch", name, interval, "first") + save)
    monkeypatch.setattr(TrainingRun, "finish_rollout", finish_rollout)
    first = read_metrics(str(tmp_path / "first"))
    resumed = _run(_argv(tmp_path, "torch", name, interval, "resumed") + save)

    _assert_same_metrics(straight, first + resumed)
    # Across the stop, the prompts generated are the straight run's, each once, in order.
    assert _scored_prompts(tmp_path, "first") + _scored_prompts(tmp_path, "resumed") == _scored_prompts(
        tmp_path, "straight")


def test_a_checkpoint_of_format_1_resumes_with_a_note_that_it_is_not_exact(tmp_path, embedded_cache, ray_cluster,
                                                                          caplog):
    save = ["--save", str(tmp_path / "ckpt"), "--save-interval", "3", "--load", str(tmp_path / "ckpt")]
    _run(_argv(tmp_path, "torch", "grpo", 1, "first") + save[:4] + ["--num-rollout", "3"])
    (checkpoint.rollout_dir(str(tmp_path / "ckpt"), SAVED_ROLLOUT) / checkpoint.RUN_STATE_FILE).unlink()
    resumed = _run(_argv(tmp_path, "torch", "grpo", 1, "resumed") + save)
    notes = [r.getMessage() for r in caplog.records if "not exact" in r.getMessage()]
    assert len(notes) == 1 and "checkpoint format 1" in notes[0], notes
    assert [r["rollout_id"] for r in resumed] == [3, 4, 5]
    assert resumed[0]["off_policy/staleness_max"] == 0  # generated again with the loaded weights
