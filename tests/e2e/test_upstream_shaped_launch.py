"""examples/upstream_shaped_launch.sh, as written (its bash arrays of upstream's flag names, run by bash), trains on
both backends with every upstream flag miles implements (a custom generate function with DAPO dynamic sampling and
an eval config among them); the same launch with refused flags added stops in one
line before Ray starts."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from miles.tracking.metrics import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "upstream_shaped_launch.sh"
# Two rollouts are enough to see a stale one (async) and the eval after rollout 2 (--eval-interval 2).
CUT = ["--num-rollout", "2", "--no-use-tensorboard", "--no-save-plots"]


def launch(backend: str, *argv: str) -> subprocess.CompletedProcess:
    # The script calls `python` as upstream's do: the test's interpreter goes first on PATH.
    env = {**os.environ, "TRAIN_BACKEND": backend, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(EXAMPLE), *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=280)


@pytest.mark.parametrize("backend", ["torch", pytest.param("megatron", marks=pytest.mark.megatron)])
def test_the_upstream_shaped_launch_trains_with_every_implemented_flag(backend, embedded_cache, tmp_path):
    debug = str(tmp_path / "debug" / "{rollout_id}.pt")
    result = launch(backend, *CUT, "--log-dir", str(tmp_path / "run"), "--save-debug-rollout-data", debug)
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_metrics(str(tmp_path / "run"))
    assert [record["off_policy/staleness_max"] for record in records] == [0, 1]  # async: rollout 1 is one stale
    for record in records:
        # --keep-old-actor: the denominator the backend recomputed is the engine's own log-probs
        assert record["off_policy/denominator_behavior_abs_diff_max"] <= 1e-4
        assert record["rollout/dynamic_filter/rounds"] >= 1  # --over-sampling-batch-size drew in rounds
        assert math.isfinite(record["critic/value_loss"])  # PPO with a critic
    assert {"eval/addition", "eval/addition_cold"} <= set(records[-1])  # --eval-config's two datasets
    for rollout_id in range(len(records)):  # the custom generate function's top_k 8 drew every kept sample
        samples = torch.load(debug.format(rollout_id=rollout_id), weights_only=False)["samples"]
        assert samples and all(s["sampling_kept_ids"] and all(len(ids) <= 8 for ids in s["sampling_kept_ids"])
                               for s in samples)


def test_the_same_launch_with_refused_flags_stops_in_one_line_naming_them_all(embedded_cache, tmp_path):
    refused = ["--use-opd", "--context-parallel-size", "2", "--bf16"]
    result = launch("megatron", *CUT, *refused, "--log-dir", str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "upstream flags miles refuses" in errors[0], result.stderr
    assert all(flag in errors[0] for flag in ("--use-opd", "--context-parallel-size 2", "--bf16"))
    assert "unrecognized arguments" not in result.stderr and not (tmp_path / "run").exists()
