"""Every mode trains on SGLang (--rollout-backend sglang), the runtime guard passes on SGLang's log-probs, and a push
the engine did not load stops the run with OffPolicyGuardError. One SGLang engine per run (a start costs ~30 s)."""

import asyncio
import math
import sys

import pytest
import ray

import miles.rollout.sglang_engine
import train
import train_async
from miles.tracking.metrics import read_metrics
from miles.utils.errors import OffPolicyGuardError
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


def test_async_ppo_keep_old_actor_denominator_matches_sglangs_log_probs(make_args):
    args = make_args("--advantage-estimator", "ppo", "--keep-old-actor", *SGLANG)
    records = _run(args, "async")
    _check_common(records, args)
    assert [record["off_policy/staleness_max"] for record in records] == [0, 1, 1]
    # the snapshot's recomputed log-probs vs SGLang's, float32 both: the guard's own tolerance is 1e-4
    assert max(record["off_policy/denominator_behavior_abs_diff_max"] for record in records) <= 1e-4


@pytest.mark.parametrize("correction", ["--use-rollout-logprobs", "--use-tis"])
def test_async_ppo_with_the_other_corrections(make_args, correction):
    args = make_args("--advantage-estimator", "ppo", correction, *SGLANG)
    records = _run(args, "async")
    _check_common(records, args)
    assert all(math.isfinite(record["critic/value_loss"]) for record in records)
    if correction == "--use-rollout-logprobs":  # the denominator is SGLang's log-probs themselves
        assert all(record["off_policy/denominator_behavior_abs_diff_max"] == 0 for record in records)
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
            self.engine.end_weight_update()
        return super()._call(what, version, result)


def test_a_push_sglang_did_not_load_stops_the_run(make_args, monkeypatch):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    monkeypatch.setattr(miles.rollout.sglang_engine, "SGLangRolloutEngine", IgnoredPushEngine)
    args = make_args("--advantage-estimator", "ppo", "--keep-old-actor", *SGLANG)
    with pytest.raises(OffPolicyGuardError, match="weight version 3 was not loaded: SGLang's update_weights_from_tensor"):
        _run(args, "async")
    # nothing is trained on after the refused push: rollout 1 (trained before it) is the last one logged, if any
    assert [record["rollout_id"] for record in read_metrics(args.log_dir)] in ([0], [0, 1])
