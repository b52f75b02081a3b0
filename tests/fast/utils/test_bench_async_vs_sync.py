"""bench/async_vs_sync.py's fixed-cost arithmetic on a hand-made Ray timeline: the push span and the idle gaps."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import async_vs_sync as bench  # noqa: E402  (bench/ is a folder of scripts, not a package)

PERIOD = 0.100  # s per rollout
# One sync rollout, (call, start, duration) in seconds from its start. The RolloutManager's load_weights starts
# when the driver submits it (during prepare) and waits for the export; the engine loads 90-93.
ROLLOUT = [
    ("RolloutManager.generate", 0.000, 0.020),
    ("TorchRolloutEngine.generate", 0.001, 0.015),
    ("RolloutManager.load_weights", 0.025, 0.070),
    ("PolicyTrainer.prepare", 0.022, 0.020),
    ("PolicyTrainer.train", 0.044, 0.040),
    ("PolicyTrainer.export_weights", 0.086, 0.004),
    ("TorchRolloutEngine.load_pushed", 0.090, 0.003),
]


def _sync_run(num_rollouts=8, t0=1000.0):
    records, events = [], []
    for k in range(num_rollouts):
        base = t0 + k * PERIOD
        records.append({"rollout_id": k, "time": base + PERIOD - 0.005})  # logged 5 ms before the next generate
        events += [{"cat": f"task::{name}", "ts": (base + start) * 1e6, "dur": duration * 1e6}
                   for name, start, duration in ROLLOUT]
    return records, events


def test_push_spans_from_the_export_to_the_engines_load():
    records, events = _sync_run()
    assert bench.push_spans(events, [records], warmup=2) == pytest.approx(0.007)  # 86 -> 93 ms


def test_idle_gaps_of_the_sync_path_add_up_to_wall_minus_the_work():
    records, events = _sync_run()
    gaps = bench.critical_path_gaps(events, [records], warmup=2, path=bench.SYNC_PATH)
    # 20 -> 22, 42 -> 44, 84 -> 86, 90 -> 90, 93 -> 100 (the next generate); load_weights is not on the path.
    assert gaps == pytest.approx({"generate -> prepare": 0.002, "prepare -> train": 0.002,
                                  "train -> export_weights": 0.002, "export_weights -> load_pushed": 0.0,
                                  "load_pushed -> generate": 0.007})
    work = 0.020 + (0.020 + 0.040) + 0.007  # G + T + push
    assert bench.wall_per_rollout([records], warmup=2) - work == pytest.approx(sum(gaps.values()))


def test_sync_cycles_split_each_rollout_into_work_and_idle():
    records, events = _sync_run()
    cycles = bench.sync_cycles(events, [records], warmup=2)
    assert len(cycles) == 4  # the timed window (rollouts 2..7 logged) holds 5 generate starts: 4 whole cycles
    for work, idle in cycles:  # busy 0-20, 22-42, 44-84, 86-90, 90-93 of each 100 ms
        assert work == pytest.approx(0.087) and idle == pytest.approx(0.013)


def test_overlapping_calls_leave_no_gap():
    """A call that starts before the busy span ends (the async actor's export beside the driver) is not idle."""
    records, _ = _sync_run()
    base = records[2]["time"] + 0.001
    events = [{"cat": "task::PolicyTrainer.prepare", "ts": base * 1e6, "dur": 10e3},
              {"cat": "task::PolicyTrainer.train", "ts": (base + 0.005) * 1e6, "dur": 10e3},
              {"cat": "task::PolicyTrainer.export_weights", "ts": (base + 0.020) * 1e6, "dur": 1e3}]
    gaps = bench.critical_path_gaps(events, [records], warmup=2, path=bench.ACTOR_WORK)
    assert gaps == pytest.approx({"prepare -> train": 0.0, "train -> export_weights": 0.005})
