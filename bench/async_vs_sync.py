"""Async vs sync training on the embedded default: how close the async loop comes to its busiest resource, and what
a user gets from it.

In one process and one Ray session it runs two configurations, GRPO with 8 x 8 and with 16 x 8 prompts x samples
(responses of up to 16 tokens; flags after ``--`` are added to every run), each with ``train.train(args)`` and with
``train_async.train(args)``, twice over: with ``--lr 0`` (the same work for both drivers) and with the flags' learning
rate (what a user runs). It reads the runs' ``metrics.jsonl`` and Ray's task timeline, leaves out the first
``--warmup`` rollouts, and prints for each configuration:

**Loop efficiency (lr 0).** With ``--lr 0`` the weights never change, so the sync and async runs generate and train
on the same rollouts (a rollout's samples depend only on its id, the seed and the weights; Adam still takes every
step, the same operations at a zero step size), and the two loops are compared on the same work:

- a per-rollout profile of both drivers from Ray's task timeline: each remote call's median, the actor's work
  (prepare + train + export), the engine's work (its generate + its load of the pushed weights), the wall time
  (the median gap between consecutive rollouts' ``time`` stamps) and the actor's wait (wall - work);
- the busiest-resource bound B = sync wall / max(actor work, engine work), all medians of the sync runs: the actor
  and the engine each run one call at a time, so a rollout of any loop takes at least the longer of the two
  works, and no overlap can make the async loop faster than B times the sync one. (Running beside each other on
  a shared machine only makes each work longer, which lowers what the async loop reaches, not B.)
- the achieved speed-up R = sync wall / async wall and its share of the bound, R / B, which stays at or under
  100 % up to noise (a share above it says the bound is wrong); and the async actor's busy fraction: the time its
  prepare, train and export calls ran over the timed rollouts, divided by their wall time (100 %: the actor never
  waits, and the loop runs as fast as the actor can go);
- G, T and push, as before: ``perf/generate_s``, the actor's prepare + train, and from the export's start to the
  engine's load's end; the sync loop's fixed cost, wall - (G + T + push), taken rollout by rollout from the
  timeline (from one generation's start to the next, the time no call of the loop runs), and where it goes: the
  median idle gaps between consecutive calls of the sync loop, and between the async actor's calls.

**Learning (the user's view).** With learning the async run trains on stale data and follows another trajectory
than the sync one, so its responses have other lengths and each rollout is other work: the loop efficiency above
does not say what a user gets. Over the same timed rollouts of each run it reports samples per second and
generated tokens per second (``rollout/num_samples`` and its product with ``rollout/response_length_mean``, over
the time from the first timed rollout to the last), async against sync; tokens per second normalize away the
different response lengths.

The last four lines are the results, two per configuration, e.g. ``8x8 loop efficiency (lr 0): async/sync speed-up
1.25x = 93% of the 1.34x busiest-resource bound; async actor busy 88% of the time; sync fixed cost 3.5 ms/rollout
= 9% of G + T + push`` and ``8x8 learning: async/sync samples/s 1.21x (1510 vs 1250), generated tokens/s 1.30x
(...)``.

Run-to-run noise on a small machine is about 10 %, as large as the effect measured, so by default it runs two
pairs of each kind per configuration in the order sync, async, async, sync (``--repeats``) and pools their
rollouts, after a short untimed warm-up run (the first run in a fresh Ray session is slower). Each run prints the
load average, so a machine shared with other work shows. ``--lr`` after ``--`` sets the learning runs' rate; the
same-work runs always add ``--lr 0`` last (the last value wins).

Usage: python bench/async_vs_sync.py [--num-rollout 40] [--warmup 5] [--repeats 2] [--keep-logs] [-- flags...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
GOAL_FIXED_COST = 0.10  # of G + T + push
CONFIGS = {  # name -> the flags of both of its runs (GRPO is the default estimator; 8 samples per prompt)
    "8x8": ["--rollout-batch-size", "8", "--rollout-max-response-len", "16"],
    "16x8": ["--rollout-batch-size", "16", "--rollout-max-response-len", "16"],
}
SAME_WORK = ["--lr", "0"]  # the weights never change: the sync and async runs train on the same rollouts
MODES = {"lr0": SAME_WORK, "learning": []}  # the same-work runs add --lr 0 last (it overrides an --lr after '--')
GENERATE_KEY = "perf/generate_s"
TRAIN_KEY = "perf/train_s"
PUSH_KEY = "perf/last_push_s"
NUM_SAMPLES_KEY = "rollout/num_samples"
RESPONSE_LENGTH_KEY = "rollout/response_length_mean"
ACTOR_WORK = ("PolicyTrainer.prepare", "PolicyTrainer.train", "PolicyTrainer.export_weights")
ENGINE_WORK = ("TorchRolloutEngine.generate", "TorchRolloutEngine.load_pushed")  # the engine's own calls
PROFILED_CALLS = (
    "RolloutManager.generate", "TorchRolloutEngine.generate", *ACTOR_WORK,
    "RolloutManager.load_weights", "TorchRolloutEngine.load_pushed",
)
# The sync loop's critical path, in the order its calls run each rollout. The push is the actor's export and the
# engines' loads: the RolloutManager's load_weights starts when the driver submits it and mostly waits.
PUSH_PATH = ("PolicyTrainer.export_weights", "TorchRolloutEngine.load_pushed")
SYNC_PATH = ("RolloutManager.generate", "PolicyTrainer.prepare", "PolicyTrainer.train", *PUSH_PATH)
MS = 1e3


def steady_records(records: list[dict], warmup: int) -> list[dict]:
    """The records after the first ``warmup`` (records sorted by rollout id); at least two, so one gap is timed."""
    if len(records) < warmup + 2:
        raise ValueError(f"{len(records)} rollouts leave no gap between two rollouts after a warm-up of {warmup}; "
                         "run at least warmup + 2 rollouts")
    return records[warmup:]


def median_metric(runs: list[list[dict]], key: str, warmup: int) -> float:
    """Median of ``record[key]`` over the steady records of every run in ``runs`` (pooled)."""
    values = [record[key] for records in runs for record in steady_records(records, warmup)
              if record.get(key) is not None]
    if not values:
        raise ValueError(f"no values of {key!r} after the first {warmup} rollouts; run more rollouts "
                         "(--num-rollout) or fewer warm-up rollouts (--warmup)")
    return statistics.median(values)


def wall_per_rollout(runs: list[list[dict]], warmup: int) -> float:
    """Median of time[k] - time[k-1] over consecutive rollouts k > warmup of every run: seconds per rollout.

    The first gap counted ends at rollout warmup + 1, so no gap includes start-up work (actors, the first push).
    """
    gaps = []
    for records in runs:
        times = [record["time"] for record in steady_records(records, warmup)]
        gaps += [later - earlier for earlier, later in itertools.pairwise(times)]
    return statistics.median(gaps)


def busiest_resource_bound(sync_wall_s: float, actor_work_s: float, engine_work_s: float) -> float:
    """B = sync wall / max(actor work, engine work), seconds per rollout of the same (sync) runs.

    The actor runs its prepare, train and export one at a time, and the engine its generate and its load of the
    pushed weights, so no loop runs a rollout in less than the longer of the two works: B is the largest speed-up
    any overlap of the two can give over the sync loop.
    """
    return sync_wall_s / max(actor_work_s, engine_work_s)


def speedup_line(sync_wall_s: float, async_wall_s: float, bound: float) -> str:
    """``async/sync speed-up Rx = S% of the Bx busiest-resource bound`` with R = sync / async wall, S = R / B."""
    ratio = sync_wall_s / async_wall_s
    return f"async/sync speed-up {ratio:.2f}x = {ratio / bound:.0%} of the {bound:.2f}x busiest-resource bound"


def timed_windows(runs: list[list[dict]], warmup: int) -> list[tuple[float, float]]:
    """``(start, end)`` unix seconds of each run's timed rollouts: from the ``time`` stamp of rollout ``warmup`` to
    that of its last rollout."""
    return [(steady[0]["time"], steady[-1]["time"]) for steady in (steady_records(r, warmup) for r in runs)]


def busy_fraction(events: list[dict], runs: list[list[dict]], warmup: int, calls: tuple[str, ...]) -> float:
    """The share of the runs' timed rollouts during which one of ``calls`` ran: the summed durations of the calls
    that started inside a run's timed window, over the summed windows' lengths (``calls`` run one at a time, in
    one process, so their durations do not overlap)."""
    windows = timed_windows(runs, warmup)
    durations = call_durations(events, windows)
    busy = sum(sum(durations.get(name, [])) for name in calls)
    return busy / sum(end - start for start, end in windows)


def throughput(runs: list[list[dict]], warmup: int) -> tuple[float, float]:
    """``(samples/s, generated tokens/s)`` over the runs' timed rollouts, pooled: the samples
    (``rollout/num_samples``) and tokens (samples x ``rollout/response_length_mean``) of the rollouts after rollout
    ``warmup``, over the time from rollout ``warmup``'s ``time`` stamp to the last one's, the span they were made
    in."""
    samples = tokens = seconds = 0.0
    for records in runs:
        steady = steady_records(records, warmup)
        made = steady[1:]
        samples += sum(record[NUM_SAMPLES_KEY] for record in made)
        tokens += sum(record[NUM_SAMPLES_KEY] * record[RESPONSE_LENGTH_KEY] for record in made)
        seconds += steady[-1]["time"] - steady[0]["time"]
    return samples / seconds, tokens / seconds


def call_durations(events: list[dict], windows: list[tuple[float, float]]) -> dict[str, list[float]]:
    """Seconds each remote call took, by ``Class.method``, for the calls that started inside one of ``windows``
    ((start, end) unix seconds, end excluded).

    ``events`` is ``ray.timeline()``: Chrome-trace dicts whose ``cat`` is ``task::Class.method`` for a task's
    execution, with ``ts`` (start) and ``dur`` in microseconds since the epoch.
    """
    durations: dict[str, list[float]] = {}
    for event in events:
        category = str(event.get("cat", ""))
        inside = any(start * 1e6 <= event.get("ts", -1.0) < end * 1e6 for start, end in windows)
        if category.startswith("task::") and inside:
            durations.setdefault(category.removeprefix("task::"), []).append(event["dur"] / 1e6)
    return durations


def call_medians(events: list[dict], runs: list[list[dict]], warmup: int) -> dict[str, float]:
    """Median seconds of each remote call (by ``Class.method``) over the timed rollouts of ``runs``, pooled."""
    return {name: statistics.median(durations)
            for name, durations in call_durations(events, timed_windows(runs, warmup)).items()}


def critical_path_calls(events: list[dict], steady: list[dict], path: tuple[str, ...]
                        ) -> list[tuple[float, float, str]]:
    """``(start, end, method)`` in seconds of the calls in ``path`` that started within one run's timed rollouts
    (``steady``), by start time."""
    start, end = steady[0]["time"] * 1e6, steady[-1]["time"] * 1e6
    return sorted(
        (event["ts"] / 1e6, (event["ts"] + event["dur"]) / 1e6, name.rsplit(".", 1)[-1])
        for event in events
        if (name := str(event.get("cat", "")).removeprefix("task::")) in path and start <= event["ts"] < end
    )


def critical_path_gaps(events: list[dict], runs: list[list[dict]], warmup: int, path: tuple[str, ...]
                       ) -> dict[str, float]:
    """Median idle seconds between the calls of ``path`` in the runs' timed rollouts, by ``"a -> b"`` (method
    names): the time from the end of the calls so far (``a`` ended last) to the start of the next one, ``b``.
    ``path`` is a loop whose calls run one after another (the sync loop), so while none of them runs the loop does
    no measured work: the gaps are Ray's hand-offs between processes and the driver's own work."""
    gaps: dict[str, list[float]] = {}
    for records in runs:
        calls = critical_path_calls(events, steady_records(records, warmup), path)
        if not calls:
            continue
        busy_until, last = calls[0][1], calls[0][2]
        for start, end, method in calls[1:]:
            if start > busy_until or end > busy_until:
                gaps.setdefault(f"{last} -> {method}", []).append(max(0.0, start - busy_until))
            if end > busy_until:
                busy_until, last = end, method
    return {label: statistics.median(values) for label, values in gaps.items()}


def sync_cycles(events: list[dict], runs: list[list[dict]], warmup: int) -> list[tuple[float, float]]:
    """``(work, idle)`` seconds of each timed rollout of the sync runs, from one ``RolloutManager.generate`` start to
    the next: the time some call of ``SYNC_PATH`` runs (the union of their intervals), and the rest. Taken rollout
    by rollout, so that a slow step in one rollout is not set against the other steps' medians."""
    cycles = []
    for records in runs:
        calls = critical_path_calls(events, steady_records(records, warmup), SYNC_PATH)
        starts = [start for start, _, method in calls if method == "generate"]
        for begin, end in itertools.pairwise(starts):
            busy, busy_until = 0.0, begin
            for start, stop in sorted((max(s, begin), min(e, end)) for s, e, _ in calls if s < end and e > begin):
                busy += max(0.0, stop - max(start, busy_until))
                busy_until = max(busy_until, stop)
            cycles.append((busy, end - begin - busy))
    return cycles


def push_spans(events: list[dict], runs: list[list[dict]], warmup: int) -> float:
    """Median seconds from the start of each ``PolicyTrainer.export_weights`` to the end of the last engine's
    ``TorchRolloutEngine.load_pushed`` that started before the next export."""
    spans = []
    for records in runs:
        calls = critical_path_calls(events, steady_records(records, warmup), PUSH_PATH)
        exports = [start for start, _, method in calls if method == "export_weights"]
        for start, next_start in zip(exports, [*exports[1:], float("inf")]):
            ends = [end for load_start, end, method in calls
                    if method == "load_pushed" and start <= load_start < next_start]
            if ends:
                spans.append(max(ends) - start)
    return statistics.median(spans)


def profile_runs(events: list[dict], runs: list[list[dict]], warmup: int, calls: tuple[str, ...],
                 actor_work: tuple[str, ...]) -> dict[str, float]:
    """Seconds per rollout over the runs' timed rollouts: each call's median duration, the actor's work (the sum
    of the ``actor_work`` calls' medians), the median wall time, and the actor's wait: wall - work."""
    medians = call_medians(events, runs, warmup)
    missing = [name for name in calls if name not in medians]
    if missing:
        raise ValueError(f"Ray's task timeline has no {missing} calls in the timed rollouts; the runs did not use "
                         "the remote classes this benchmark profiles")
    profile = {name: medians[name] for name in calls}
    profile["actor work"] = sum(profile[name] for name in actor_work)
    profile["wall"] = wall_per_rollout(runs, warmup)
    profile["actor waits (wall - work)"] = profile["wall"] - profile["actor work"]
    return profile


def profile_table(profiles: dict[str, dict[str, float | None]], rows: list[str]) -> list[str]:
    """Aligned lines: one row per quantity (seconds, shown in ms; None shows as '-'), one column per kind of run."""
    title = "per rollout, median ms"
    width = max(len(row) for row in [*rows, title])
    columns = {kind: max(8, len(kind)) for kind in profiles}
    lines = [f"  {title.ljust(width)}  " + "  ".join(kind.rjust(columns[kind]) for kind in profiles)]
    for row in rows:
        cells = []
        for kind, profile in profiles.items():
            value = profile.get(row)
            cells.append(("-" if value is None else f"{value * MS:.1f}").rjust(columns[kind]))
        lines.append(f"  {row.ljust(width)}  " + "  ".join(cells))
    return lines


def run_training(driver: str, argv: list[str], log_dir: Path) -> list[dict]:
    """Run ``train.train`` (driver "sync") or ``train_async.train`` ("async") in this process; return its
    metrics records."""
    import train
    import train_async
    from miles.tracking.metrics import read_metrics
    from miles.utils.arguments import parse_args

    args = parse_args(argv=[*argv, "--log-dir", str(log_dir)])
    print(f"[bench] {driver} run: {' '.join(argv)}", flush=True)
    start = time.perf_counter()
    if driver == "sync":
        train.train(args)
    else:
        asyncio.run(train_async.train(args))
    print(f"[bench] {driver} run done in {time.perf_counter() - start:.1f} s (start-up included); "
          f"{load_note()}", flush=True)
    return read_metrics(log_dir)


def load_note() -> str:
    """The 1-minute load average against the core count: a benchmark's own runs add about 2 (engine, actor,
    RolloutManager, driver), so a clearly higher load means other work shared the machine."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    return f"load average {load:.1f} on {cores} cores" + (" (shared: numbers are noisy)" if load > cores + 1 else "")


def alternating_order(kinds: list[str], repeat: int) -> list[str]:
    """``kinds`` in order on even repeats and reversed on odd ones (A B, B A, ...), so a drift in the machine's
    speed during the benchmark does not favor the kind that always runs first."""
    return kinds if repeat % 2 == 0 else kinds[::-1]


def warm_up_run(log_root: Path, extra: list[str]) -> None:
    """A short untimed run first: the first run in a fresh Ray session is slower (Ray's own processes are still
    starting), and would otherwise bias whichever kind of run comes first."""
    print("[bench] warm-up run (not timed)", flush=True)
    run_training("sync", training_argv(3, extra), log_root / "warm-up")


def training_argv(num_rollout: int, extra: list[str]) -> list[str]:
    """The benchmarks' runs: the torch training backend (their recorded numbers were measured with it before
    megatron became the default; ``bench/backends.py`` compares the two, and a later ``--train-backend`` in
    ``extra`` wins), no TensorBoard, no end-of-run plots."""
    return ["--num-rollout", str(num_rollout), "--eval-interval", "0", "--no-use-tensorboard", "--no-save-plots",
            "--train-backend", "torch", *extra]


def loop_efficiency(name: str, runs: dict[str, list[list[dict]]], events: list[dict], warmup: int
                    ) -> tuple[list[str], str]:
    """The same-work (lr 0) runs of one configuration: printed lines and the result line. ``runs`` maps
    "sync"/"async" to the metrics records of each repeat."""
    profiles = {kind: profile_runs(events, kind_runs, warmup, PROFILED_CALLS, ACTOR_WORK)
                for kind, kind_runs in runs.items()}
    for profile in profiles.values():
        profile["engine work"] = sum(profile[call] for call in ENGINE_WORK)
    sync_profile, async_profile = profiles["sync"], profiles["async"]
    bound = busiest_resource_bound(sync_profile["wall"], sync_profile["actor work"], sync_profile["engine work"])
    ratio = sync_profile["wall"] / async_profile["wall"]
    actor_busy = busy_fraction(events, runs["async"], warmup, ACTOR_WORK)
    generate_s = median_metric(runs["sync"], GENERATE_KEY, warmup)
    train_s = sync_profile["PolicyTrainer.prepare"] + sync_profile["PolicyTrainer.train"]
    push_s = push_spans(events, runs["sync"], warmup)
    cycles = sync_cycles(events, runs["sync"], warmup)
    fixed_s = statistics.median(idle for _, idle in cycles)
    fixed_share = statistics.median(idle / work for work, idle in cycles)
    gaps = critical_path_gaps(events, runs["sync"], warmup, SYNC_PATH)
    actor_gaps = critical_path_gaps(events, runs["async"], warmup, ACTOR_WORK)
    metric_medians = ", ".join(f"{key} {median_metric(runs['sync'], key, warmup) * MS:.1f} ms"
                               for key in (GENERATE_KEY, TRAIN_KEY, PUSH_KEY))
    rows = [*PROFILED_CALLS, "actor work", "engine work", "wall", "actor waits (wall - work)"]
    lines = [
        f"{name} loop efficiency (lr 0): rollouts {warmup}.. of {len(runs['sync'])} run(s) each, medians:",
        *profile_table(profiles, rows),
        f"  sync run metrics: {metric_medians} (perf/train_s: optimizer steps only)",
        (f"  busiest-resource bound: sync wall {sync_profile['wall'] * MS:.1f} ms / max(actor work "
         f"{sync_profile['actor work'] * MS:.1f}, engine work {sync_profile['engine work'] * MS:.1f}) = {bound:.2f}x; "
         f"achieved {ratio:.2f}x = {ratio / bound:.0%} of it; the async actor is busy {actor_busy:.0%} of the time"),
        (f"  G = {generate_s * MS:.1f} ms generate, T = {train_s * MS:.1f} ms train (actor prepare + train), "
         f"push = {push_s * MS:.1f} ms (export to loaded); sync fixed cost, rollout by rollout (generate to next "
         f"generate, minus the time a call of the sync loop runs): {fixed_s * MS:.1f} ms/rollout = {fixed_share:.0%} "
         f"of its G + T + push (goal: <= {GOAL_FIXED_COST:.0%}); from the medians, wall - (G + T + push) = "
         f"{(sync_profile['wall'] - generate_s - train_s - push_s) * MS:.1f} ms"),
        "  idle between the sync loop's calls, median ms: "
        + ", ".join(f"{label} {gap * MS:.1f}" for label, gap in gaps.items()),
        "  async actor idle between its calls, median ms: "
        + ", ".join(f"{label} {gap * MS:.1f}" for label, gap in actor_gaps.items()),
    ]
    result = (f"{name} loop efficiency (lr 0): {speedup_line(sync_profile['wall'], async_profile['wall'], bound)}; "
              f"async actor busy {actor_busy:.0%} of the time; sync fixed cost {fixed_s * MS:.1f} ms/rollout = "
              f"{fixed_share:.0%} of G + T + push")
    return lines, result


def learning_view(name: str, runs: dict[str, list[list[dict]]], warmup: int) -> tuple[list[str], str]:
    """The learning runs of one configuration: samples/s and generated tokens/s of each driver over the same
    timed rollouts, and the result line with their async/sync ratios."""
    rates = {kind: throughput(kind_runs, warmup) for kind, kind_runs in runs.items()}
    lengths = {kind: statistics.mean(record[RESPONSE_LENGTH_KEY] for records in kind_runs
                                     for record in steady_records(records, warmup)[1:])
               for kind, kind_runs in runs.items()}
    lines = [f"{name} learning: rollouts {warmup + 1}.. of {len(runs['sync'])} run(s) each, over their span:"]
    lines += [f"  {kind}: {samples:.0f} samples/s, {tokens:.0f} generated tokens/s (mean response "
              f"{lengths[kind]:.2f} tokens)" for kind, (samples, tokens) in rates.items()]
    (sync_samples, sync_tokens), (async_samples, async_tokens) = rates["sync"], rates["async"]
    result = (f"{name} learning: async/sync samples/s {async_samples / sync_samples:.2f}x "
              f"({async_samples:.0f} vs {sync_samples:.0f}), generated tokens/s {async_tokens / sync_tokens:.2f}x "
              f"({async_tokens:.0f} vs {sync_tokens:.0f})")
    return lines, result


def report(runs: dict[str, list[list[dict]]], events: list[dict], warmup: int) -> list[str]:
    """The printed result; the last lines are the results, two per configuration. ``runs`` maps
    ``"<config>-<mode>-<driver>"`` (modes: ``MODES``) to the metrics records of each repeat."""
    lines, results = [], []
    for name in CONFIGS:
        def kinds(mode: str) -> dict[str, list[list[dict]]]:
            return {driver: runs[f"{name}-{mode}-{driver}"] for driver in ("sync", "async")}

        for config_lines, result in (loop_efficiency(name, kinds("lr0"), events, warmup),
                                     learning_view(name, kinds("learning"), warmup)):
            lines += config_lines
            results.append(result)
    return lines + results


def parse_options(description: str, default_num_rollout: int, repeats_help: str,
                  add_options: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The benchmarks' shared command line, checked: --num-rollout, --warmup, --repeats, --keep-logs, extra flags,
    and a benchmark's own options (``add_options``)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    if add_options is not None:
        add_options(parser)
    parser.add_argument("--num-rollout", type=int, default=default_num_rollout,
                        help="rollouts per run (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=5, help="first rollouts left out (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=2, help=f"{repeats_help} (default: %(default)s)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the run folders (their path is printed)")
    parser.add_argument("extra", nargs="*", help="training flags for every run, after '--' (e.g. -- --lr 1e-4)")
    options = parser.parse_args()
    if options.warmup < 0 or options.num_rollout < options.warmup + 3 or options.repeats < 1:
        parser.error(f"--num-rollout {options.num_rollout}, --warmup {options.warmup}, --repeats {options.repeats}: "
                     "need --warmup >= 0, --num-rollout >= warmup + 3 (two timed gaps) and --repeats >= 1")
    return options


@contextlib.contextmanager
def bench_session(keep_logs: bool, folder_prefix: str):
    """One Ray session for a benchmark's runs, shut down on every exit path, and a temporary folder for their run
    folders (yielded; deleted unless ``keep_logs``). The drivers' ``ray_session`` reuses this Ray, so actor
    start-up is the only per-run cost."""
    sys.path.insert(0, str(REPO_ROOT))  # the drivers train.py and train_async.py live at the repository root
    import ray

    log_root = Path(tempfile.mkdtemp(prefix=folder_prefix))
    # "local": a cluster of its own, even beside a running one (whose work would also skew the timings).
    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    try:
        yield log_root
    finally:
        ray.shutdown()
        if keep_logs:
            print(f"[bench] run folders kept in {log_root}")
        else:
            shutil.rmtree(log_root, ignore_errors=True)


def run_schedule(schedule: list[tuple[str, str, list[str]]], options: argparse.Namespace,
                 folder_prefix: str) -> tuple[dict[str, list[list[dict]]], list[dict]]:
    """Run ``(name, driver, argv)`` in order, after a warm-up run, in one ``bench_session``.

    Returns each name's metrics records (one list per run, names in first-run order) and Ray's task timeline.
    """
    records: dict[str, list[list[dict]]] = {}
    with bench_session(options.keep_logs, folder_prefix) as log_root:
        import ray

        warm_up_run(log_root, options.extra)
        for index, (name, driver, argv) in enumerate(schedule):
            log_dir = log_root / f"{index:02d}-{name.replace('+', '-')}"
            records.setdefault(name, []).append(run_training(driver, argv, log_dir))
        events = ray.timeline()
    return records, events


def main() -> None:
    options = parse_options(__doc__, default_num_rollout=40,
                            repeats_help="sync/async pairs of each kind, in alternating order (sync async, async "
                                         "sync, ...), pooled; more damp a shared machine's noise")
    schedule = [(f"{name}-{mode}-{driver}", driver,
                 training_argv(options.num_rollout, [*flags, *options.extra, *MODES[mode]]))
                for name, flags in CONFIGS.items() for mode in MODES for repeat in range(options.repeats)
                for driver in alternating_order(["sync", "async"], repeat)]
    runs, events = run_schedule(schedule, options, "miles-bench-async-")
    print("\n".join(report(runs, events, options.warmup)))


if __name__ == "__main__":
    main()
