"""Train roles as groups of ranks in real runs: data parallelism (both backends) and tensor parallelism (megatron)
take the single-process steps, the guard covers every rank's snapshot shard, a dead rank ends the run quickly and
leaves nothing behind."""

import asyncio
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import ray
import torch

import miles.ray.run
import train
import train_async
from miles.backends.training_utils import checkpoint
from miles.backends.train_process import PolicyTrainer
from miles.tracking.metrics import read_metrics
from miles.utils.errors import MilesConfigError, OffPolicyGuardError, ProcessDiedError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
GRPO = ["--advantage-estimator", "grpo", "--num-rollout", "3", "--lr", "1e-3"]
DP2 = ["--actor-num-gpus-per-node", "2", "--micro-batch-size", "4"]  # 16 samples: 8 per rank, 2 micro-batches
TP2 = ["--actor-num-gpus-per-node", "2", "--tensor-model-parallel-size", "2"]  # vocabulary 15: padded to 16


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


_SINGLE_PROCESS_RUNS: dict[str, list[dict]] = {}  # backend -> metrics of the one-rank run, shared by the tests


def _single_process_metrics(make_args, tmp_path, backend: str) -> list[dict]:
    if backend not in _SINGLE_PROCESS_RUNS:
        _SINGLE_PROCESS_RUNS[backend] = _run_sync(make_args(*GRPO, "--train-backend", backend,
                                                            "--log-dir", str(tmp_path / "single")))
    return _SINGLE_PROCESS_RUNS[backend]


@pytest.mark.parametrize(
    ("backend", "ranks"),
    [("torch", DP2),
     pytest.param("megatron", DP2, marks=pytest.mark.megatron),
     pytest.param("megatron", [*TP2, "--sequence-parallel"], marks=pytest.mark.megatron)],
    ids=["torch-dp2", "megatron-dp2", "megatron-tp2-sp"],  # plain TP2: tests/fast/megatron, the tests below
)
def test_ranks_log_the_single_process_metrics(make_args, tmp_path, backend, ranks):
    single = _single_process_metrics(make_args, tmp_path, backend)
    _assert_same_metrics(single, _run_sync(make_args(*GRPO, "--train-backend", backend, *ranks)))


def _parent(pid: int) -> int:
    """The parent pid, from /proc/PID/stat (the field after the parenthesized command name)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _descends_from_this_process(pid: int) -> bool:
    """True for a process this test process started, directly or not (ray.init here started the raylet, which
    starts the workers): other test sessions on the same machine have ranks of their own."""
    while pid > 1:
        pid = _parent(pid)
        if pid == os.getpid():
            return True
    return False


def _rank_processes() -> list[int]:
    """Pids of this Ray session's live actor ranks (Ray titles a rank's process after its trainer class:
    ``ray::PolicyTrainer...``)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            pid = int(cmdline.parent.name)
            if b"ray::PolicyTrainer" in cmdline.read_bytes() and _descends_from_this_process(pid):
                pids.append(pid)
        except OSError:  # the process ended meanwhile
            continue
    return pids


def test_a_killed_rank_ends_the_run_with_an_error_and_releases_every_rank(make_args):
    """SIGKILL one actor rank while the run trains: the run fails with the dead rank's one-line error and no rank
    process is left. No clock is asserted: the surviving rank's collectives end at the latest after the process
    group's own time-out (COLLECTIVE_TIMEOUT_S), and this module's pytest time-out turns any hang into a failure."""
    args = make_args(*GRPO, *DP2, "--num-rollout", "200")
    killed, run_over = threading.Event(), threading.Event()

    def kill_rank_one_once_training():
        while not run_over.is_set() and not killed.is_set():
            ranks = _rank_processes()
            if len(ranks) == 2 and os.path.exists(os.path.join(args.log_dir, "metrics.jsonl")):
                os.kill(max(ranks), signal.SIGKILL)
                killed.set()
            time.sleep(0.2)

    killer = threading.Thread(target=kill_rank_one_once_training, daemon=True)
    killer.start()
    try:
        with pytest.raises(Exception) as failure:
            _run_sync(args)
    finally:
        run_over.set()
        killer.join()
    assert killed.is_set(), "no rank was killed: the run ended before training started"
    assert isinstance(failure.value, ProcessDiedError), failure.value
    assert re.match(r"the actor's rank [01] \(pid \d+\) process died (after rollout \d+|during start-up); the run "
                    r"stopped\. Nothing is saved \(no --save\)\.$", str(failure.value)), failure.value
    while _rank_processes():  # ray.kill ends the released ranks asynchronously
        time.sleep(0.5)


class RankOneShardCorruptingTrainer(PolicyTrainer):
    """Adds noise to tensor-parallel rank 1's shard of a fused QKV weight in the snapshot of version 2, keeping its
    version and fingerprint labels: only the gathered whole of every rank's shards can show it."""

    def export_weights(self, rollouts_trained: int, after_training: bool = False):
        from megatron.core import parallel_state  # in the rank's process, which has built GPTModel

        payload = super().export_weights(rollouts_trained, after_training)
        if self.weight_version == 2 and parallel_state.get_tensor_model_parallel_rank() == 1:
            shard = self.exporter.snapshots._snapshots[2].state_dict["decoder.layers.0.self_attention.linear_qkv.weight"]
            shard.add_(1e-3 * torch.randn_like(shard))
        return payload


@pytest.mark.megatron
def test_keep_old_actor_at_tensor_parallel_two_passes_the_guard_and_catches_one_ranks_corrupted_shard(
        make_args, monkeypatch):
    """Async PPO, actor and critic at TP=2: rollouts 0 and 1 pass the guard with the engine-exact denominator; the
    snapshot of version 2, corrupted on rank 1 only, stops rollout 2 with OffPolicyGuardError."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import this module
    monkeypatch.setattr(miles.ray.run, "PolicyTrainer", RankOneShardCorruptingTrainer)
    args = make_args("--train-backend", "megatron", *TP2, "--advantage-estimator", "ppo", "--keep-old-actor",
                     "--num-rollout", "4")
    with pytest.raises(OffPolicyGuardError, match="rollout 2: generated by weight version 2"):
        asyncio.run(train_async.train(args))
    records = read_metrics(args.log_dir)
    assert [record["rollout_id"] for record in records] == [0, 1]
    for record in records:
        assert record["off_policy/denominator_behavior_abs_diff_max"] <= 1e-4
        assert record["off_policy/num_snapshots"] <= 2


def test_a_data_parallel_checkpoint_resumes_with_another_data_parallel_size(make_args, tmp_path):
    """DP replicas are identical, so DP rank 0 saves one ordinary checkpoint, and a one-rank run resumes from it:
    the rollout count continues, and the weight versions are the straight run's (the start-up push is the saved
    version again, the one rollout 2 would have been generated with)."""
    save = tmp_path / "ckpt"
    first = _run_sync(make_args(*GRPO, *DP2, "--num-rollout", "2", "--save", str(save),
                                "--log-dir", str(tmp_path / "dp2")))
    assert checkpoint.latest_rollout_id(str(save)) == 1
    assert sorted(path.name for path in checkpoint.rollout_dir(str(save), 1).iterdir()) == ["actor", "run_state.pt"]
    resumed = _run_sync(make_args(*GRPO, "--load", str(save), "--log-dir", str(tmp_path / "resumed")))
    assert [record["rollout_id"] for record in resumed] == [2]
    saved = checkpoint.load_trainer_state(checkpoint.rollout_dir(str(save), 1) / "actor")
    assert resumed[0]["rollout/weight_version"] == saved["weight_version"] == len(first) + 1


@pytest.mark.megatron
def test_a_tensor_parallel_checkpoint_resumes_with_more_data_parallel_ranks_but_not_another_tensor_parallel_size(
        make_args, tmp_path):
    """TP rank 0 writes the gathered HF weights and every TP rank's optimizer state (its shards'); a resume at TP=2
    x DP=2 continues, a resume at TP=1 is refused naming both sizes."""
    save = tmp_path / "ckpt"
    megatron = ["--train-backend", "megatron", "--save", str(save), "--load", str(save)]
    _run_sync(make_args(*GRPO, *megatron, *TP2, "--num-rollout", "2", "--log-dir", str(tmp_path / "tp2")))
    role_dir = checkpoint.rollout_dir(str(save), 1) / "actor"
    state = checkpoint.load_trainer_state(role_dir)
    assert state["tensor_model_parallel_size"] == 2 and len(state["tensor_parallel_optimizers"]) == 2
    assert (role_dir / "model.safetensors").is_file()  # the whole model, readable by either backend
    resumed = _run_sync(make_args(*GRPO, *megatron, "--actor-num-gpus-per-node", "4", "--tensor-model-parallel-size",
                                  "2", "--micro-batch-size", "8", "--log-dir", str(tmp_path / "tp2dp2")))
    assert [record["rollout_id"] for record in resumed] == [2]
    with pytest.raises(MilesConfigError, match="saved with --tensor-model-parallel-size 2, but this run uses 1"):
        _run_sync(make_args(*GRPO, *megatron, "--num-rollout", "4", "--log-dir", str(tmp_path / "tp1")))
