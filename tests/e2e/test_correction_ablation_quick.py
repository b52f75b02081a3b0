"""Smoke test of bench/correction_ablation.py --quick --arms: the arms given (and sync PPO) run and log the metrics
its report reads."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]  # the machine may be shared

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "bench"))
import correction_ablation as ablation  # noqa: E402  (bench/ is a folder of scripts, not a package)
from tests.fast.bench.test_correction_ablation import EXPECTED_CORRECTION  # noqa: E402

# The arms that reach a different part of the bench: the two the contract refuses (the bench's in-process switch),
# a TIS hook loaded by path, and a critic-free one; sync PPO, the reference, always runs. Every arm's launch and
# correction label is checked in tests/fast/bench/test_correction_ablation.py, and each one's flags train end to end
# in tests/e2e (test_training, test_corrections): running all 12 here would cost a minute of CI for the same code.
SMOKE_ARMS = ("ppo-uncorrected", "ppo+opsm", "ppo+icepop", "grpo+tis")


def test_quick_mode_runs_the_arms_it_is_given_and_logs_their_metrics(tmp_path, embedded_cache):
    env = dict(os.environ)  # embedded_cache points MILES_CACHE_DIR at the session's built model: no rebuild
    command = [sys.executable, "bench/correction_ablation.py", "--quick", "--arms", *SMOKE_ARMS, "--out", str(tmp_path)]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1140, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "contract is SWITCHED OFF for this run only" in result.stdout
    assert result.stdout.strip().splitlines()[-2].startswith("final eval accuracy relative to sync PPO")
    assert result.stdout.strip().splitlines()[-1].startswith("training reward (mean of the last 10 rollouts")
    assert (tmp_path / "correction_ablation.png").stat().st_size > 0
    runs = json.loads((tmp_path / "RESULTS.json").read_text())["runs"]
    quick_configs = ablation.arm_configs(ablation.QUICK["intervals"], SMOKE_ARMS)
    expected = {ablation.arm_label(arm, interval) for arm, interval in quick_configs}
    assert set(runs) == expected and len(expected) == len(SMOKE_ARMS) + 1  # and sync PPO
    for label, seeds in runs.items():
        records = seeds["0"]
        assert [record["rollout_id"] for record in records] == list(range(ablation.QUICK["num_rollout"])), label
        assert {record["off_policy/correction"] for record in records} == {EXPECTED_CORRECTION[label.split()[0]]}
        logged = {key for record in records for key in record}
        assert {ablation.EVAL_KEY, ablation.REWARD_KEY, "off_policy/policy_behavior_kl", "train/pg_clipfrac"} <= logged
