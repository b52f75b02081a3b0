"""The rollout as upstream runs it, on the embedded default's torch engine: an upstream-style generate function talks
HTTP to the sglang-router miles starts, with an upstream-form reward, under async PPO with --keep-old-actor; the
router process exists during the run and none is left after it, after a failure, and after SIGTERM (the SGLang
engine's run is in test_sglang_training.py)."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import train_async
from miles.tracking.metrics import read_metrics
from tests.e2e.conftest import SMALL_RUN
from tests.e2e.processes import ROUTER, ProcessWatch, processes_with
from tests.e2e.tool_server import RESULT as TOOL_RESULT
from tests.e2e.tool_server import ToolServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_STYLE = ["--custom-generate-function-path", "examples.custom_generate.single_turn_http.generate",
                  "--custom-rm-path", "examples.custom_generate.reward.reward_func"]


def test_an_upstream_style_http_generate_function_trains_async_ppo_keep_old_actor(make_args, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # the examples' dotted paths, as a launch from the repository names them
    monkeypatch.syspath_prepend(str(ROOT))
    dump = tmp_path / "dump" / "{rollout_id}.pt"
    args = make_args("--advantage-estimator", "ppo", "--keep-old-actor", "--num-rollout", "3",
                     "--save-debug-rollout-data", str(dump), *UPSTREAM_STYLE)
    with ProcessWatch(ROUTER) as watch:
        asyncio.run(train_async.train(args))
    records = read_metrics(args.log_dir)
    assert [record["rollout_id"] for record in records] == [0, 1, 2]
    assert [record["off_policy/staleness_max"] for record in records] == [0, 1, 1]
    # the snapshot's recompute against the log-probs the engine served over HTTP (the guard's tolerance is 1e-4)
    assert max(record["off_policy/denominator_behavior_abs_diff_max"] for record in records) <= 1e-4
    for rollout_id, versions in enumerate([[1], [1], [2]]):  # W_g(k), g(k) = k - d(k): the async schedule
        samples = torch.load(str(dump).format(rollout_id=rollout_id), weights_only=False)["samples"]
        assert {tuple(sample["weight_versions"]) for sample in samples} == {tuple(versions)}
    assert len(watch.seen[ROUTER]) == 1  # one router, miles' own, for the run
    assert watch.alive() == []


def _trained_tool_tokens(dump: str, rollouts: int, tool_ids: list[int]) -> int:
    """Reads the saved rollouts: every sample has two engine turns with the tool's tokens between them at loss mask
    0 and log-prob 0.0; returns how many samples there were."""
    count = 0
    for rollout_id in range(rollouts):
        for sample in torch.load(dump.format(rollout_id=rollout_id), weights_only=False)["samples"]:
            first, second = sample["segments"]
            response = sample["tokens"][len(sample["tokens"]) - sample["response_length"]:]
            assert response[first["end"]:second["start"]] == tool_ids
            assert set(sample["loss_mask"][first["end"]:second["start"]]) == {0}
            assert set(sample["loss_mask"][:first["end"]] + sample["loss_mask"][second["start"]:]) == {1}
            assert set(sample["rollout_log_probs"][first["end"]:second["start"]]) == {0.0}
            count += 1
    return count


@pytest.mark.parametrize("correction", ["--keep-old-actor", "--use-tis", "--use-rollout-logprobs"])
def test_a_multi_turn_function_with_a_tool_trains_async_ppo_under_each_correction(make_args, monkeypatch, tmp_path,
                                                                                  correction):
    """Upstream's multi-turn shape: engine turns through the router, a local tool's output between them (mask 0,
    log-prob 0.0), no versions recorded by the function; the guard passes on every rollout."""
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    dump = str(tmp_path / "dump" / "{rollout_id}.pt")
    with ToolServer() as tool:
        args = make_args("--advantage-estimator", "ppo", correction, "--num-rollout", "3", "--save-debug-rollout-data",
                         dump, "--custom-generate-function-path", "examples.custom_generate.multi_turn_http.generate",
                         "--tool-url", tool.url, "--custom-rm-path", "examples.custom_generate.reward.reward_func")
        asyncio.run(train_async.train(args))
    records = read_metrics(args.log_dir)
    assert [record["rollout_id"] for record in records] == [0, 1, 2]
    if correction == "--keep-old-actor":  # the snapshots' recompute on every engine token, the tool's left out
        assert max(record["off_policy/denominator_behavior_abs_diff_max"] for record in records) <= 1e-4
    from miles.models.hf import load_tokenizer

    tool_ids = load_tokenizer(args.hf_checkpoint).encode(TOOL_RESULT, add_special_tokens=False)
    assert _trained_tool_tokens(dump, 3, tool_ids) == 3 * 4 * 4 == len(tool.queries)  # one query per sample


def test_a_router_that_does_not_come_up_is_one_line_and_leaves_nothing(embedded_cache, tmp_path):
    with socket.socket() as taken:  # the router's metrics port, taken: sglang-router exits at start
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "train_async.py", *SMALL_RUN, "--advantage-estimator", "grpo", "--router-prometheus-port",
             str(port), "--log-dir", str(tmp_path / "run")],
            cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "sglang-router at http://127.0.0.1:" in errors[0], result.stderr
    assert "did not come up within" in errors[0] and "Traceback" not in result.stderr


def test_sigterm_stops_the_run_and_its_router(embedded_cache, tmp_path):
    run = subprocess.Popen(
        [sys.executable, "train_async.py", *SMALL_RUN, "--advantage-estimator", "grpo", "--num-rollout", "200",
         *UPSTREAM_STYLE, "--log-dir", str(tmp_path / "run")],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    try:
        routers = []
        for _ in range(1800):  # the router starts once the engines and the trainers are up: 180 s at most
            routers = processes_with(ROUTER, root=run.pid)
            if routers or run.poll() is not None:
                break
            time.sleep(0.1)
        assert routers, "the run's router never appeared"
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(30)
    assert run.returncode == 143, stderr  # 128 + SIGTERM: the clean stop after the rollout in progress
    assert not any(router.is_running() for router in routers)
