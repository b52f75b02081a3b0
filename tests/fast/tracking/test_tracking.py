"""MetricsTracker: crash-safe JSONL, TensorBoard scalars, the progress bar, the summary and the run folder."""

import json
import math
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from miles.tracking.metrics import (
    MetricsTracker,
    default_log_dir,
    format_summary,
    progress_postfix,
    read_metrics,
    to_json_safe,
)
from miles.utils.errors import MilesConfigError


class FakeClock:
    """A monotonic clock the test moves by hand, so throughput and wall time have exact expected values."""

    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _reject_constant(name):
    raise AssertionError(f"invalid JSON constant {name} written")


def _strict_json_lines(path: Path) -> list[dict]:
    """Parse every line as strict JSON: NaN/Infinity (Python's non-standard extension) fail the test."""
    return [json.loads(line, parse_constant=_reject_constant) for line in path.read_text().splitlines()]


def _tracker(tmp_path, use_tensorboard=False, total=30, start=0, clock=None, config=None) -> MetricsTracker:
    return MetricsTracker(
        str(tmp_path / "run"),
        use_tensorboard=use_tensorboard,
        total_rollouts=total,
        start_rollout_id=start,
        config=config if config is not None else {"lr": 3e-4},
        driver="train_async",
        clock=clock if clock is not None else FakeClock(),
    )


def _tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    accumulator = EventAccumulator(str(log_dir / "tb"))
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def test_default_log_dir_is_runs_timestamp_driver_estimator():
    before = time.time()
    log_dir = default_log_dir("train_async", "ppo")
    match = re.fullmatch(r"runs/(\d{8}-\d{6})-train_async-ppo", log_dir)
    assert match, log_dir
    stamped = time.mktime(time.strptime(match.group(1), "%Y%m%d-%H%M%S"))
    assert before - 1 <= stamped <= time.time()


class TestJsonl:
    def test_round_trip_with_non_finite_as_null_and_each_line_flushed(self, tmp_path):
        tracker = _tracker(tmp_path)
        tracker.log(0, {"rollout/reward_mean": 0.25, "train/pg_loss": math.nan, "train/grad_norm": math.inf,
                        "perf/generate_s": -math.inf, "off_policy/correction": "tis", "train/skipped": False})
        tracker.log(1, {"rollout/num_samples": np.int64(128), "train/kl": np.float32(0.5),
                        "train/loss": torch.tensor(1.5), "train/per_step": torch.tensor([1.0, math.nan])})
        # Read while the tracker is still open: a crash right now must lose nothing already logged.
        records = _strict_json_lines(tmp_path / "run" / "metrics.jsonl")
        tracker.close()
        assert [r["rollout_id"] for r in records] == [0, 1]
        assert all(isinstance(r["time"], float) and abs(r["time"] - time.time()) < 60 for r in records)
        assert {k: v for k, v in records[0].items() if k not in ("rollout_id", "time")} == {
            "rollout/reward_mean": 0.25, "train/pg_loss": None, "train/grad_norm": None,
            "perf/generate_s": None, "off_policy/correction": "tis", "train/skipped": False,
        }
        assert records[1]["rollout/num_samples"] == 128 and records[1]["train/kl"] == 0.5
        assert records[1]["train/loss"] == 1.5 and records[1]["train/per_step"] == [1.0, None]

    def test_config_json_is_json_safe(self, tmp_path):
        config = {"lr": 3e-4, "save": Path("/ckpt"), "bad": math.nan, "sizes": (1, 2), "note": None}
        _tracker(tmp_path, config=config).close()
        saved = json.loads((tmp_path / "run" / "config.json").read_text(), parse_constant=_reject_constant)
        assert saved == {"lr": 3e-4, "save": "/ckpt", "bad": None, "sizes": [1, 2], "note": None}

    def test_reserved_metric_names_are_refused(self, tmp_path):
        with _tracker(tmp_path) as tracker:
            with pytest.raises(ValueError, match="reserved"):
                tracker.log(0, {"time": 1.0})

    def test_appends_to_an_existing_run_folder(self, tmp_path):
        with _tracker(tmp_path) as tracker:
            tracker.log(0, {"rollout/reward_mean": 0.1})
        with _tracker(tmp_path, start=1) as tracker:
            tracker.log(1, {"rollout/reward_mean": 0.2})
        assert [r["rollout/reward_mean"] for r in read_metrics(tmp_path / "run")] == [0.1, 0.2]


def _nulls_for_non_finite(value):
    """The reference: the same structure with every NaN/inf float replaced by None (what JSON can hold)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _nulls_for_non_finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_nulls_for_non_finite(item) for item in value]
    return value


json_like = st.recursive(
    st.floats() | st.integers(-(2**60), 2**60) | st.booleans() | st.text(max_size=3) | st.none(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=10,
)


@given(json_like)
def test_to_json_safe_gives_strict_json_with_nulls_exactly_where_values_were_not_finite(value):
    assert json.loads(json.dumps(to_json_safe(value), allow_nan=False)) == _nulls_for_non_finite(value)


def test_tensorboard_holds_every_numeric_metric_with_rollout_id_as_step(tmp_path):
    with _tracker(tmp_path, use_tensorboard=True) as tracker:
        for rollout_id in range(3):
            tracker.log(rollout_id, {"rollout/reward_mean": 0.1 * rollout_id, "train/pg_loss": -0.5 + rollout_id,
                                     "off_policy/correction": "keep_old_actor"})
        tracker.log(3, {"rollout/reward_mean": math.nan})
    scalars = _tensorboard_scalars(tmp_path / "run")
    assert set(scalars) == {"rollout/reward_mean", "train/pg_loss"}  # the string metric is JSONL-only
    assert [step for step, _ in scalars["rollout/reward_mean"]] == [0, 1, 2, 3]
    assert [v for _, v in scalars["rollout/reward_mean"][:3]] == pytest.approx([0.0, 0.1, 0.2])
    assert math.isnan(scalars["rollout/reward_mean"][3][1])  # NaN is kept visible in TensorBoard
    assert scalars["train/pg_loss"] == [(0, -0.5), (1, 0.5), (2, 1.5)]


def test_resumed_run_purges_tensorboard_events_from_the_resume_rollout_on(tmp_path):
    with _tracker(tmp_path, use_tensorboard=True) as tracker:
        for rollout_id in range(6):
            tracker.log(rollout_id, {"rollout/reward_mean": float(rollout_id)})
    with _tracker(tmp_path, use_tensorboard=True, start=4) as tracker:  # crashed after 5, checkpoint at 3
        for rollout_id in range(4, 6):
            tracker.log(rollout_id, {"rollout/reward_mean": 10.0 + rollout_id})
    assert _tensorboard_scalars(tmp_path / "run")["rollout/reward_mean"] == [
        (0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 14.0), (5, 15.0)
    ]


class TestSummary:
    def test_numbers_against_hand_computed_values(self, tmp_path):
        clock = FakeClock(100.0)
        tracker = _tracker(tmp_path, clock=clock)
        for k in range(25):
            clock.now += 2.0
            metrics = {"rollout/reward_mean": k / 100, "off_policy/staleness_mean": 0.0 if k == 0 else 1.0,
                       "off_policy/staleness_max": float(k % 3), "off_policy/tis_raw_min": 1.0 - k / 100,
                       "off_policy/tis_mean": math.nan if k == 3 else 1.0 + (k % 2) * 0.1,
                       "off_policy/correction": "tis"}
            if k % 10 == 0:
                metrics["eval/accuracy"] = {0: 0.3, 10: 0.6, 20: 0.5}[k]
            tracker.log(k, metrics)
        clock.now += 1.0
        summary = tracker.close()
        assert summary["rollouts_logged"] == 25
        assert summary["wall_time_s"] == pytest.approx(51.0)
        assert summary["reward_window"] == 10
        assert summary["reward_mean_first_10"] == pytest.approx(sum(range(10)) / 10 / 100)  # 0.045
        assert summary["reward_mean_last_10"] == pytest.approx(sum(range(15, 25)) / 10 / 100)  # 0.195
        assert (summary["eval_accuracy_best"], summary["eval_accuracy_last"]) == (0.6, 0.5)
        odd_without_3 = [k for k in range(25) if k % 2 == 1 and k != 3]  # 11 of the 24 finite values are 1.1
        assert summary["off_policy"] == {
            "off_policy/staleness_mean": pytest.approx(24 / 25),
            "off_policy/staleness_max": 2.0,  # the worst rollout, not the mean
            "off_policy/tis_raw_min": pytest.approx(1.0 - 24 / 100),
            "off_policy/tis_mean": pytest.approx((24 + 0.1 * len(odd_without_3)) / 24),
            "off_policy/correction": "tis",
        }
        on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert on_disk["reward_mean_last_10"] == pytest.approx(0.195)

    def test_short_run_averages_what_it_has_and_misses_nothing_it_lacks(self, tmp_path):
        with _tracker(tmp_path) as tracker:
            for k, reward in enumerate([0.2, 0.4, 0.9]):
                tracker.log(k, {"rollout/reward_mean": reward})
        summary = tracker.close()
        assert summary["reward_window"] == 3
        assert summary["reward_mean_first_10"] == summary["reward_mean_last_10"] == pytest.approx(0.5)
        assert summary["eval_accuracy_best"] is None and summary["off_policy"] == {}

    def test_format_summary_aligns_values_and_leaves_out_unknowns(self):
        summary = {"log_dir": "runs/x", "rollouts_logged": 200, "wall_time_s": 123.45, "reward_window": 10,
                   "reward_mean_first_10": 0.1125, "reward_mean_last_10": 0.65312, "eval_accuracy_best": None,
                   "eval_accuracy_last": None,
                   "off_policy": {"off_policy/staleness_max": 1.0, "off_policy/tis_raw_std": 0.1}}
        lines = format_summary(summary).splitlines()
        assert lines[0] == "run summary (runs/x)"
        rows = dict(re.fullmatch(r"  (.+?)  +(\S.*)", line).groups() for line in lines[1:-1])
        assert rows == {"rollouts logged": "200", "wall time": "123.5 s", "reward mean, first 10 rollouts": "0.1125",
                        "reward mean, last 10 rollouts": "0.6531", "off_policy/staleness_max": "1"}
        # tis_raw_std is in summary.json but not among the printed off-policy numbers
        value_columns = {len(line) - len(line.split("  ")[-1].lstrip()) for line in lines[1:-1]}
        assert len(value_columns) == 1
        assert lines[-1] == "  curves: python -m miles.tracking.plot runs/x"


class TestProgressBar:
    def test_postfix_formats_the_known_values_only(self):
        assert progress_postfix(0.41234, None, 1.0, 64.0) == {"reward": "0.412", "stale": "1.000", "samples/s": "64.0"}
        assert progress_postfix(None, 0.5, None, None) == {"eval": "0.500"}

    def test_bar_shows_throughput_between_logs_and_keeps_the_last_eval(self, tmp_path, capsys):
        clock = FakeClock(0.0)
        tracker = _tracker(tmp_path, clock=clock, total=5, start=2)
        clock.now = 10.0
        tracker.log(2, {"rollout/reward_mean": 0.25, "rollout/num_samples": 128, "eval/accuracy": 0.75})
        clock.now = 12.0  # 128 samples in 2 s
        tracker.log(3, {"rollout/reward_mean": 0.5, "rollout/num_samples": 128, "off_policy/staleness_mean": 1.0})
        tracker.close()
        final = capsys.readouterr().err.split("\r")[-1]
        assert "train_async" in final and "4/5" in final
        assert "reward=0.500, eval=0.750, stale=1.000, samples/s=64.0" in final


class TestClosing:
    def test_exception_inside_the_block_closes_everything_and_propagates(self, tmp_path):
        with pytest.raises(ZeroDivisionError):
            with _tracker(tmp_path, use_tensorboard=True) as tracker:
                tracker.log(0, {"rollout/reward_mean": 0.5})
                1 / 0
        assert json.loads((tmp_path / "run" / "summary.json").read_text())["rollouts_logged"] == 1
        assert _tensorboard_scalars(tmp_path / "run") == {"rollout/reward_mean": [(0, 0.5)]}  # flushed on close
        with pytest.raises(RuntimeError, match="closed"):
            tracker.log(1, {"rollout/reward_mean": 0.5})

    def test_close_is_idempotent(self, tmp_path):
        tracker = _tracker(tmp_path)
        tracker.log(0, {"rollout/reward_mean": 0.5})
        assert tracker.close() is tracker.close()


class TestReadMetrics:
    def _write(self, tmp_path, text) -> Path:
        (tmp_path / "metrics.jsonl").write_text(text)
        return tmp_path

    def test_sorted_by_rollout_and_a_relogged_rollout_takes_the_later_values(self, tmp_path):
        run_dir = self._write(tmp_path, '{"rollout_id": 1, "a": 1, "b": 2}\n{"rollout_id": 0, "a": 0}\n'
                                        '{"rollout_id": 1, "a": 10}\n')
        assert read_metrics(run_dir) == [{"rollout_id": 0, "a": 0}, {"rollout_id": 1, "a": 10, "b": 2}]

    def test_torn_last_line_is_skipped_but_a_complete_last_line_is_kept(self, tmp_path):
        assert read_metrics(self._write(tmp_path, '{"rollout_id": 0}\n{"rollout_id": 1, "a"')) == [{"rollout_id": 0}]
        assert len(read_metrics(self._write(tmp_path, '{"rollout_id": 0}\n{"rollout_id": 1}'))) == 2

    @pytest.mark.parametrize("text, match", [
        ('{"rollout_id": 0}\n{"rollout_id": 1, "a"\n{"rollout_id": 2}\n', "line 2 is not valid JSON"),
        ('{"rollout_id": 0}\n[1, 2]\n', "line 2 is not a metrics record"),
        ("\n\n", "holds no metrics records"),
    ])
    def test_malformed_or_empty_file_is_a_config_error(self, tmp_path, text, match):
        with pytest.raises(MilesConfigError, match=match):
            read_metrics(self._write(tmp_path, text))

    def test_missing_file_names_the_folder(self, tmp_path):
        with pytest.raises(MilesConfigError, match=f"no metrics.jsonl in {re.escape(str(tmp_path))}"):
            read_metrics(tmp_path)
