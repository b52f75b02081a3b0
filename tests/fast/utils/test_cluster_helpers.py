"""Small helpers of the Ray layer that need no cluster: bundle counting, per-engine rollout seeds, prompt splits."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import miles.ray.rollout_manager as rollout_manager_module
from miles.ray.cluster import count_bundles
from miles.ray.rollout_manager import RolloutManager, _split, rollout_seed
from miles.utils.errors import OffPolicyGuardError

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("num_engines", "train_ranks", "colocate", "expected"),
    [
        (1, 1, False, 2),  # engine + actor
        (2, 1, False, 3),
        (2, 2, False, 4),  # engines + actor + critic
        (3, 2, True, 2),  # colocated engines share the actor's bundle
        (4, 1, True, 1),
        (1, 4, False, 5),  # engine + DP=2 actor + DP=2 critic
    ],
)
def test_count_bundles(num_engines, train_ranks, colocate, expected):
    assert count_bundles(num_engines, train_ranks, colocate) == expected


def test_rollout_seed_differs_per_rollout_engine_and_base_seed():
    seeds = {
        (base, rollout, engine): rollout_seed(base, rollout, engine)
        for base in (0, 1, 12) for rollout in range(40) for engine in range(4)
    }
    assert len(set(seeds.values())) == len(seeds)
    assert rollout_seed(1, 23, 4) != rollout_seed(12, 3, 4)  # digits do not run together
    assert all(0 <= seed < 2**63 for seed in seeds.values())  # a valid torch.Generator seed


def test_rollout_seed_is_deterministic_across_processes():
    """A rollout is reproducible from its id: no per-process randomness such as Python's salted ``hash``."""
    code = "from miles.ray.rollout_manager import rollout_seed; print(rollout_seed(7, 3, 1), rollout_seed(0, 0, 0))"
    other_hash_seed = str(int(os.environ.get("PYTHONHASHSEED") or 0) + 1)  # differs from this process's salt
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONHASHSEED": other_hash_seed, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert result.stdout.split() == [str(rollout_seed(7, 3, 1)), str(rollout_seed(0, 0, 0))]


@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("num_items", [0, 1, 5, 6, 16, 17])
def test_split_is_contiguous_nearly_equal_and_keeps_order(num_items, parts):
    items = [f"prompt-{i}" for i in range(num_items)]
    shares = _split(items, parts)
    assert len(shares) == parts
    assert [item for share in shares for item in share] == items  # contiguous and in order, nothing lost
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1


class _EngineLoading:
    """What a TorchRolloutEngine's ``load_pushed`` returns: (version, the fingerprint sent, the one it computed)."""

    def __init__(self, loaded: str) -> None:
        self.load_pushed = self  # called as engine.load_pushed.remote(ref), like a Ray actor method
        self.loaded = loaded

    def remote(self, payload_ref):
        return (3, "a" * 64, self.loaded)


def test_an_engine_that_loaded_other_weights_stops_the_push_and_is_named(monkeypatch):
    manager = object.__new__(RolloutManager)
    manager.engines = [_EngineLoading("a" * 64), _EngineLoading("b" * 64)]
    monkeypatch.setattr(rollout_manager_module.ray, "wait", lambda refs, **_: (refs, []))
    monkeypatch.setattr(rollout_manager_module.ray, "get", lambda values: values)
    with pytest.raises(OffPolicyGuardError, match=r"weight version 3: rollout engine\(s\) \[1\] loaded weights with "
                                                  r"fingerprint\(s\) \['bbbbbbbbbbbb'\], but the trainer pushed "
                                                  r"fingerprint aaaaaaaaaaaa"):
        manager.load_weights(["push ref"])


@pytest.mark.parametrize(("flag", "env", "expected"), [(None, None, "local"), (None, "10.0.0.1:6379", "10.0.0.1:6379"),
                                                       ("auto", "10.0.0.1:6379", "auto")])
def test_a_run_starts_its_own_local_cluster_unless_told_to_join_one(monkeypatch, flag, expected, env):
    """Without --ray-address or $RAY_ADDRESS, a run beside another one must not try to join the other's cluster."""
    from miles.ray import cluster

    calls = []
    monkeypatch.setattr(cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(cluster.ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(cluster.ray, "shutdown", lambda: None)
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    with cluster.ray_session(flag, num_cpus=3):
        pass
    assert calls[0]["address"] == expected
    assert ("num_cpus" in calls[0]) == (expected == "local")
