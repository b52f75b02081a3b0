"""An async run stopped and resumed with --load is the straight run: for rollouts after the stop it logs the same
metrics (every metric but times, rates and memory), and it trains the same prompts, none skipped or repeated.

Each case is a straight run of 6 rollouts that saves at rollout 2 (--save-interval 3) and a resume from that
checkpoint to 6. The SIGTERM cases stop another run, which saves nowhere else, with a real SIGTERM to the driver's
process at a rollout the test picks, resume it, and compare both parts with the same straight run (so where the
stop comes after rollout 2, the straight run's own save is shown not to change what it trains next). A reward
function that records every prompt it scores gives the prompts each run generated (the resumed run generates no
prompt twice: the rollout in flight at the save is carried, not generated again). The straight runs are made once
per module and shared by the tests that compare with them.
"""

import asyncio
import math
import os
import shutil
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
# (correction, interval, the rollout after which SIGTERM stops the run): mid-interval and at a push, early and late.
SIGTERM_CASES = [("keep-old-actor", 1, 3), ("use-tis", 2, 2), ("use-rollout-logprobs", 2, 1), ("grpo", 1, 2)]
# On the torch backend, the SIGTERM cases' straight runs (each correction, both intervals between them: a straight
# run is made once and shared) and --keep-old-actor at the other interval, whose snapshot store holds two versions
# between pushes; on megatron (its train processes start slower) one PPO correction at each interval, with the
# snapshot store at interval 2 (a save between pushes: the engines' weights are in the checkpoint).
CASES = [pytest.param("torch", name, interval, id=f"torch-{name}-N{interval}")
         for name, interval in [*((name, interval) for name, interval, _ in SIGTERM_CASES), ("keep-old-actor", 2)]]
CASES += [pytest.param("megatron", name, interval, id=f"megatron-{name}-N{interval}", marks=pytest.mark.megatron)
          for name, interval in (("keep-old-actor", 2), ("use-tis", 1))]
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


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, embedded_cache, ray_cluster):
    """(metrics, scored prompts, checkpoint folder) of the straight run of a case, made on first use."""
    runs = {}

    def get(backend: str, name: str, interval: int):
        if (backend, name, interval) not in runs:
            folder = tmp_path_factory.mktemp(f"straight-{backend}-{name}-{interval}")
            argv = _argv(folder, backend, name, interval, "straight")
            records = _run(argv + ["--save", str(folder / "ckpt"), "--save-interval", "3"])
            runs[backend, name, interval] = records, _scored_prompts(folder, "straight"), folder / "ckpt"
        return runs[backend, name, interval]

    return get


def _checkpoint_at(source, target, rollout_id: int) -> str:
    """A copy of the straight run's checkpoint folder whose latest is ``rollout_id`` (its save in the middle)."""
    shutil.copytree(source, target)
    checkpoint.mark_latest(str(target), rollout_id)
    return str(target)


@pytest.mark.parametrize(("backend", "name", "interval"), CASES)
def test_a_resume_from_a_save_interval_checkpoint_continues_the_straight_run(backend, name, interval, tmp_path,
                                                                             straight_run):
    straight, straight_prompts, saved = straight_run(backend, name, interval)
    ckpt = _checkpoint_at(saved, tmp_path / "ckpt", SAVED_ROLLOUT)
    resumed = _run(_argv(tmp_path, backend, name, interval, "resumed") + ["--save", ckpt, "--load", ckpt])

    _assert_same_metrics(straight[SAVED_ROLLOUT + 1:], resumed)
    stale = [r["off_policy/staleness_max"] for r in straight]
    assert stale == ([0, 1, 1, 1, 1, 1] if interval == 1 else [0, 1, 2, 1, 2, 1])  # d(k) from the original start
    # The straight run scored rollouts 0-5, the resumed one only 4 and 5: rollout 3 was carried in the checkpoint.
    per_rollout = len(straight_prompts) // NUM_ROLLOUT
    assert _scored_prompts(tmp_path, "resumed") == straight_prompts[(SAVED_ROLLOUT + 2) * per_rollout:]


@pytest.mark.parametrize(("name", "interval", "stop_after"), SIGTERM_CASES)
def test_a_resume_after_sigterm_continues_the_straight_run(name, interval, stop_after, tmp_path, straight_run,
                                                           monkeypatch):
    straight, straight_prompts, _ = straight_run("torch", name, interval)
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
    assert _scored_prompts(tmp_path, "first") + _scored_prompts(tmp_path, "resumed") == straight_prompts


def test_a_checkpoint_of_format_1_resumes_with_a_note_that_it_is_not_exact(tmp_path, straight_run, caplog):
    straight, _, saved = straight_run("torch", "grpo", 1)
    ckpt = _checkpoint_at(saved, tmp_path / "ckpt", SAVED_ROLLOUT)
    (checkpoint.rollout_dir(ckpt, SAVED_ROLLOUT) / checkpoint.RUN_STATE_FILE).unlink()  # as saved before format 2
    resumed = _run(_argv(tmp_path, "torch", "grpo", 1, "resumed") + ["--save", ckpt, "--load", ckpt])
    notes = [r.getMessage() for r in caplog.records if "not exact" in r.getMessage()]
    assert len(notes) == 1 and "checkpoint format 1" in notes[0], notes
    assert [r["rollout_id"] for r in resumed] == [3, 4, 5]
    assert resumed[0]["off_policy/staleness_max"] == 0  # generated again with the loaded weights
    saved_state = checkpoint.load_trainer_state(checkpoint.rollout_dir(ckpt, SAVED_ROLLOUT) / "actor")
    saved_pushes = saved_state["weight_version"]
    assert resumed[0]["rollout/weight_version"] == saved_pushes + 1  # a new push, not the straight run's version
    assert straight[SAVED_ROLLOUT + 1]["rollout/weight_version"] == saved_pushes - 1
