"""bench/async_vs_sync.py's arithmetic on hand-made Ray timelines: the busiest-resource bound, the actor's busy
fraction, the learning runs' throughput, the push span and the idle gaps."""

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


# One async rollout at the speed of its busiest resource: the actor's prepare, train and export back to back
# (64 ms, as in ROLLOUT), the engine's generate and load beside them.
ASYNC_PERIOD = 0.064
ASYNC_ROLLOUT = [
    ("PolicyTrainer.prepare", 0.000, 0.020),
    ("PolicyTrainer.train", 0.020, 0.040),
    ("PolicyTrainer.export_weights", 0.060, 0.004),
    ("TorchRolloutEngine.generate", 0.010, 0.015),
    ("TorchRolloutEngine.load_pushed", 0.030, 0.003),
]


def _run(rollout=ROLLOUT, period=PERIOD, num_rollouts=8, t0=1000.0):
    records, events = [], []
    for k in range(num_rollouts):
        base = t0 + k * period
        records.append({"rollout_id": k, "time": base + period - 0.005})  # logged 5 ms before the next rollout
        events += [{"cat": f"task::{name}", "ts": (base + start) * 1e6, "dur": duration * 1e6}
                   for name, start, duration in rollout]
    return records, events



def test_the_bound_is_the_sync_wall_over_the_busiest_resources_work():
    records, events = _run()
    profile = bench.profile_runs(events, [records], 2, bench.PROFILED_CALLS, bench.ACTOR_WORK)
    actor = profile["actor work"]
    engine = sum(profile[call] for call in bench.ENGINE_WORK)
    assert (actor, engine) == pytest.approx((0.020 + 0.040 + 0.004, 0.015 + 0.003))
    assert bench.busiest_resource_bound(profile["wall"], actor, engine) == pytest.approx(0.100 / 0.064)
    # When the engine is the busier one, it sets the bound.
    assert bench.busiest_resource_bound(0.100, 0.020, 0.050) == pytest.approx(2.0)


def test_a_loop_at_its_busiest_resources_speed_reaches_the_whole_bound_and_keeps_the_actor_busy():
    sync_records, sync_events = _run()
    async_records, async_events = _run(ASYNC_ROLLOUT, ASYNC_PERIOD)
    assert bench.wall_per_rollout([async_records], warmup=2) == pytest.approx(ASYNC_PERIOD)
    line = bench.speedup_line(0.100, bench.wall_per_rollout([async_records], warmup=2), 0.100 / 0.064)
    assert line == "async/sync speed-up 1.56x = 100% of the 1.56x busiest-resource bound"
    assert bench.busy_fraction(async_events, [async_records], 2, bench.ACTOR_WORK) == pytest.approx(1.0)
    # The sync actor works 64 of every 100 ms.
    assert bench.busy_fraction(sync_events, [sync_records], 2, bench.ACTOR_WORK) == pytest.approx(0.64)


def test_throughput_counts_the_samples_and_tokens_made_in_the_timed_span():
    # 10 rollouts, 0.1 s apart, 64 samples each, mean response length k tokens for rollout k.
    records = [{"rollout_id": k, "time": 100.0 + 0.1 * k, bench.NUM_SAMPLES_KEY: 64.0,
                bench.RESPONSE_LENGTH_KEY: float(k)} for k in range(10)]
    samples_per_s, tokens_per_s = bench.throughput([records], warmup=4)
    # Rollouts 5..9 are made in the span from rollout 4's stamp to rollout 9's: 5 x 64 samples in 0.5 s, and
    # 64 x (5 + 6 + 7 + 8 + 9) = 2240 tokens.
    assert samples_per_s == pytest.approx(5 * 64 / 0.5)
    assert tokens_per_s == pytest.approx(2240 / 0.5)


def test_push_spans_from_the_export_to_the_engines_load():
    records, events = _run()
    assert bench.push_spans(events, [records], warmup=2) == pytest.approx(0.007)  # 86 -> 93 ms


def test_idle_gaps_of_the_sync_path_add_up_to_wall_minus_the_work():
    records, events = _run()
    gaps = bench.critical_path_gaps(events, [records], warmup=2, path=bench.SYNC_PATH)
    # 20 -> 22, 42 -> 44, 84 -> 86, 90 -> 90, 93 -> 100 (the next generate); load_weights is not on the path.
    assert gaps == pytest.approx({"generate -> prepare": 0.002, "prepare -> train": 0.002,
                                  "train -> export_weights": 0.002, "export_weights -> load_pushed": 0.0,
                                  "load_pushed -> generate": 0.007})
    work = 0.020 + (0.020 + 0.040) + 0.007  # G + T + push
    assert bench.wall_per_rollout([records], warmup=2) - work == pytest.approx(sum(gaps.values()))


def test_sync_cycles_split_each_rollout_into_work_and_idle():
    records, events = _run()
    cycles = bench.sync_cycles(events, [records], warmup=2)
    assert len(cycles) == 4  # the timed window (rollouts 2..7 logged) holds 5 generate starts: 4 whole cycles
    for work, idle in cycles:  # busy 0-20, 22-42, 44-84, 86-90, 90-93 of each 100 ms
        assert work == pytest.approx(0.087) and idle == pytest.approx(0.013)


def test_overlapping_calls_leave_no_gap():
    """A call that starts before the busy span ends (the async actor's export beside the driver) is not idle."""
    records, _ = _run()
    base = records[2]["time"] + 0.001
    events = [{"cat": "task::PolicyTrainer.prepare", "ts": base * 1e6, "dur": 10e3},
              {"cat": "task::PolicyTrainer.train", "ts": (base + 0.005) * 1e6, "dur": 10e3},
              {"cat": "task::PolicyTrainer.export_weights", "ts": (base + 0.020) * 1e6, "dur": 1e3}]
    gaps = bench.critical_path_gaps(events, [records], warmup=2, path=bench.ACTOR_WORK)
    assert gaps == pytest.approx({"prepare -> train": 0.0, "train -> export_weights": 0.005})
