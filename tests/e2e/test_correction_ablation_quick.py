"""Smoke test of bench/correction_ablation.py --quick: every arm runs and logs the metrics its report reads."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]  # 12 arms; the machine may be shared

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "bench"))
import correction_ablation as ablation  # noqa: E402  (bench/ is a folder of scripts, not a package)

# The denominator each arm must have trained with (the actor's own label), so the uncorrected arm is proved
# uncorrected and every corrected arm corrected.
EXPECTED_CORRECTION = {
    "sync-ppo": "none", "ppo+rollout-logprobs": "rollout_logprobs", "ppo+tis": "tis",
    "ppo+keep-old-actor": "keep_old_actor", "ppo-uncorrected": "none", "grpo": "none", "grpo+tis": "tis",
    "ppo+icepop": "tis", "ppo+geo-mask": "tis", "ppo+seq-tis": "tis", "ppo+opsm": "none", "ppo+opsm+tis": "tis",
}


def test_quick_mode_runs_every_arm_and_logs_its_metrics(tmp_path, embedded_cache):
    env = dict(os.environ)  # embedded_cache points MILES_CACHE_DIR at the session's built model: no rebuild
    result = subprocess.run([sys.executable, "bench/correction_ablation.py", "--quick", "--out", str(tmp_path)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=1140, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "contract is SWITCHED OFF for this run only" in result.stdout
    assert result.stdout.strip().splitlines()[-2].startswith("final eval accuracy relative to sync PPO")
    assert result.stdout.strip().splitlines()[-1].startswith("training reward (mean of the last 10 rollouts")
    assert (tmp_path / "correction_ablation.png").stat().st_size > 0
    runs = json.loads((tmp_path / "RESULTS.json").read_text())["runs"]
    quick_configs = ablation.arm_configs(ablation.QUICK["intervals"])
    expected = {ablation.arm_label(arm, interval) for arm, interval in quick_configs}
    assert set(runs) == expected and len(expected) == len(ablation.ARMS)
    for label, seeds in runs.items():
        records = seeds["0"]
        assert [record["rollout_id"] for record in records] == list(range(ablation.QUICK["num_rollout"])), label
        assert {record["off_policy/correction"] for record in records} == {EXPECTED_CORRECTION[label.split()[0]]}
        logged = {key for record in records for key in record}
        assert {ablation.EVAL_KEY, ablation.REWARD_KEY, "off_policy/policy_behavior_kl", "train/pg_clipfrac"} <= logged
