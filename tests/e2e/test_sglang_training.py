"""Every mode trains on SGLang (--rollout-backend sglang), the runtime guard passes on SGLang's log-probs, and a push
the engine did not load stops the run with OffPolicyGuardError. One SGLang engine per run (a start costs ~30 s)."""

import asyncio
import math
import sys
from pathlib import Path

import pytest
import ray
import torch

import miles.rollout.sglang_engine
import train
import train_async
from miles.tracking.metrics import read_metrics
from miles.utils.errors import OffPolicyGuardError
from tests.e2e.processes import ROUTER, SGLANG_SERVER, ProcessWatch
from tests.e2e.tool_server import ToolServer
from tests.e2e.sglang_marks import needs_sglang

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, needs_sglang, pytest.mark.timeout(900)]

SGLANG = ["--rollout-backend", "sglang", "--num-rollout", "3"]


def _run(args, driver) -> list[dict]:
    if driver == "async":
        asyncio.run(train_async.train(args))
    else:
        train.train(args)
    return read_metrics(args.log_dir)


def _check_common(records: list[dict], args) -> None:
    """Three rollouts trained; SGLang's push cost is reported; no stand-in was ever called."""
    assert [record["rollout_id"] for record in records] == [0, 1, 2]
    for record in records:
        assert math.isfinite(record["train/pg_loss"])
        assert record["perf/sglang_update_s"] > 0 and record["perf/sglang_checksum_s"] > 0
    log = f"{args.log_dir}/sglang_stand_ins.log"
    assert not __import__("os").path.exists(log) or open(log).read() == ""


def test_an_upstream_style_http_generate_function_trains_on_sglangs_servers(make_args, monkeypatch, tmp_path):
    """Upstream's shape end to end, under top-p 0.9 / top-k 20: the function posts to the router miles started, which
    sends each request to an engine's front and from there to SGLang's own server process; SGLang's log-probs
    renormalized over the kept set are the snapshot's recompute under that set (the guard and the denominator check
    pass; the untruncated path is checked by the --use-rollout-logprobs run below). During the run there are one
    router and one SGLang server process; after it, neither."""
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root))
    dump = tmp_path / "dump" / "{rollout_id}.pt"
    args = make_args("--advantage-estimator", "ppo", "--keep-old-actor", "--rollout-top-p", "0.9",
                     "--rollout-top-k", "20", "--save-debug-rollout-data", str(dump), "--custom-generate-function-path",
                     "examples.custom_generate.single_turn_http.generate", "--custom-rm-path",
                     "examples.custom_generate.reward.reward_func", *SGLANG)
    with ProcessWatch(ROUTER, SGLANG_SERVER) as watch:
        records = _run(args, "async")
    _check_common(records, args)
    assert [record["off_policy/staleness_max"] for record in records] == [0, 1, 1]
    # the snapshot's recomputed log-probs vs SGLang's, float32 both: the guard's own tolerance is 1e-4
    assert max(record["off_policy/denominator_behavior_abs_diff_max"] for record in records) <= 1e-4
    saved = torch.load(str(dump).format(rollout_id=0), weights_only=False)["samples"]
    assert all(sample["sampling_kept_ids"] is not None for sample in saved)
    assert len(watch.seen[ROUTER]) == 1 and len(watch.seen[SGLANG_SERVER]) == 1
    assert watch.alive() == []


def test_a_multi_turn_function_with_a_tool_trains_on_sglang(make_args, monkeypatch, tmp_path):
    """Engine turns served by SGLang's server, a local tool's output between them (mask 0, log-prob 0.0): the
    snapshot's recompute matches SGLang's log-probs on every engine token."""
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root))
    dump = tmp_path / "dump" / "{rollout_id}.pt"
    with ToolServer() as tool:
        args = make_args("--advantage-estimator", "ppo", "--keep-old-actor", "--custom-generate-function-path",
                         "examples.custom_generate.multi_turn_http.generate", "--tool-url", tool.url,
                         "--save-debug-rollout-data", str(dump), *SGLANG)
        records = _run(args, "async")
    _check_common(records, args)
    assert max(record["off_policy/denominator_behavior_abs_diff_max"] for record in records) <= 1e-4
    saved = torch.load(str(dump).format(rollout_id=2), weights_only=False)["samples"]
    assert all(len(sample["segments"]) == 2 for sample in saved) and len(tool.queries) == 3 * 16


@pytest.mark.parametrize("correction", ["--use-rollout-logprobs", "--use-tis"])
def test_async_ppo_with_the_other_corrections(make_args, correction):
    args = make_args("--advantage-estimator", "ppo", correction, *SGLANG)
    records = _run(args, "async")
    _check_common(records, args)
    assert all(math.isfinite(record["critic/value_loss"]) for record in records)
    if correction == "--use-rollout-logprobs":  # the denominator is SGLang's log-probs themselves
        assert all(record["off_policy/correction"] == "rollout_logprobs" for record in records)
        assert all(record["train/train_rollout_logprob_abs_diff"] == 0 for record in records)
        # rollout 0 is generated by the weights it trains with: the trainer's log-probs are SGLang's, to float32
        assert records[0]["off_policy/policy_behavior_abs_diff"] <= 1e-5
    else:
        assert all(0 <= record["off_policy/tis_applied_max"] <= 2.0 for record in records)


def test_async_grpo_and_sync_ppo_with_a_critic(make_args, tmp_path):
    grpo = make_args("--advantage-estimator", "grpo", *SGLANG)
    _check_common(_run(grpo, "async"), grpo)
    sync = make_args("--advantage-estimator", "ppo", *SGLANG, "--log-dir", str(tmp_path / "sync"))
    records = _run(sync, "sync")
    _check_common(records, sync)
    assert [record["off_policy/staleness_max"] for record in records] == [0, 0, 0]
    assert all(math.isfinite(record["critic/value_loss"]) for record in records)


class IgnoredPushEngine(miles.rollout.sglang_engine.SGLangRolloutEngine):
    """The real engine, whose update of weight version 3 runs outside SGLang's weight-update session: SGLang
    refuses it and keeps version 2's weights."""

    def _call(self, what, version, result):
        if version == 3 and what == "begin_weight_update":
            self._post("/end_weight_update")
        return super()._call(what, version, result)


def test_a_push_sglang_did_not_load_stops_the_run(make_args, monkeypatch):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    monkeypatch.setattr(miles.rollout.sglang_engine, "SGLangRolloutEngine", IgnoredPushEngine)
    args = make_args("--advantage-estimator", "ppo", "--keep-old-actor", *SGLANG)
    with pytest.raises(OffPolicyGuardError, match="weight version 3 was not loaded: SGLang's update_weights_from_tensor"):
        _run(args, "async")
    # nothing is trained on after the refused push: rollout 1 (trained before it) is the last one logged, if any
    assert [record["rollout_id"] for record in read_metrics(args.log_dir)] in ([0], [0, 1])
