"""TrainingRun.stopped without a cluster: a stop saves the last finished rollout only when every train process still
holds its weights, and the line ends with what --save holds (Ray's calls are stubbed: ray.get returns its argument)."""

from types import SimpleNamespace

import pytest
import ray

from miles.backends.training_utils import checkpoint
from miles.ray.run import TrainingRun
from miles.utils.errors import DivergenceError, OffPolicyGuardError


class _Role:
    """A train process as the run sees it: which rollout its weights hold, and its saves."""

    def __init__(self, holds: int | None):
        self.saved: list[int] = []
        self.trained_rollout_id = SimpleNamespace(remote=lambda: holds)
        self.save = SimpleNamespace(remote=lambda root, rollout_id: self.saved.append(rollout_id))


def _run(tmp_path, actor_holds, critic_holds, save=True) -> TrainingRun:
    (tmp_path / "ckpt").mkdir()  # the roles' saves, stubbed here, would create it
    args = SimpleNamespace(save=str(tmp_path / "ckpt") if save else None, critic_save=str(tmp_path / "ckpt"),
                           update_weights_interval=1,
                           use_rollout_logprobs=False, use_tis=False, keep_old_actor=False)  # no correction
    manager = SimpleNamespace(prompt_position=SimpleNamespace(remote=lambda rollout_id: 4 * rollout_id))
    run = TrainingRun(args, rollout_manager=manager, actor=_Role(actor_holds), critic=_Role(critic_holds),
                      tracker=None, start_rollout_id=0)
    run.last_finished_rollout = 3
    return run


@pytest.fixture(autouse=True)
def _no_cluster(monkeypatch):
    monkeypatch.setattr(ray, "get", lambda refs: refs)


def test_a_stop_saves_the_last_finished_rollout_when_every_process_holds_it(tmp_path):
    run = _run(tmp_path, actor_holds=3, critic_holds=3)
    error = run.stopped(DivergenceError("rollout 4, actor: the loss is nan at optimizer step 1"))
    assert run.actor.saved == run.critic.saved == [3] and checkpoint.latest_rollout_id(run.args.save) == 3
    run_state = checkpoint.load_run_state(run.args.save, 3)  # no generation was in flight: nothing is carried
    assert (run_state["prompt_position"], run_state["in_flight"]) == (16, None)
    assert str(error) == (f"rollout 4, actor: the loss is nan at optimizer step 1 Saved rollout 3 in {run.args.save}; "
                          f"resume with --load {run.args.save}.")


def test_a_stop_saves_nothing_when_a_process_already_stepped_on_the_next_rollout(tmp_path):
    run = _run(tmp_path, actor_holds=3, critic_holds=4)  # the PPO critic steps in parallel with the actor
    error = run.stopped(DivergenceError("rollout 4, actor: the loss is nan at optimizer step 1"))
    assert run.actor.saved == run.critic.saved == [] and checkpoint.latest_rollout_id(run.args.save) is None
    assert str(error).endswith("Rollout 3 is not saved: a train process had already stepped on rollout 4. No "
                               f"checkpoint in --save {run.args.save} yet.")


def test_a_stop_without_save_says_so(tmp_path):
    error = _run(tmp_path, 3, 3, save=False).stopped(OffPolicyGuardError("rollout 4: stale"))
    assert str(error) == "rollout 4: stale Nothing is saved (no --save)."
