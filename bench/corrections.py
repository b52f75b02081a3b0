"""What each behavior-policy correction costs: async PPO with each one against async GRPO without one.

In one process and one Ray session it runs ``train_async.train`` four times with the same settings and rollout
seeds: GRPO without a correction (the baseline), and PPO with ``--use-rollout-logprobs``, with ``--use-tis`` and
with ``--keep-old-actor``. Every run adds ``--lr 0`` (last, so it overrides an ``--lr`` after ``--``): with
learning each arm would train on its own trajectory, with its own response lengths, and the arms would do
different work; at lr 0 the weights never change, every arm generates and trains on the same rollouts (the
printed mean response length shows it), and the differences are the corrections' costs. (Adam and the critic
still take every step, at a zero step size.) Leaving out the first ``--warmup`` rollouts, it prints for each run:

- wall: the median time between consecutive rollouts (``time`` stamps in ``metrics.jsonl``);
- tokens: the mean generated tokens per rollout (``rollout/num_samples`` x ``rollout/response_length_mean``), the
  same for every arm at lr 0;
- perf/train_s: the median time of the actor's optimizer steps (the metric);
- prepare: the median time of the actor's ``prepare`` call (runtime guard, ratio denominator, advantages), from
  Ray's task timeline: this is where the corrections differ (rollout log-probs skip the recompute pass,
  keep-old-actor swaps a weight snapshot in and out for it), and ``perf/train_s`` does not include it;
- actor peak RSS: the largest ``perf/actor_peak_rss_mb`` (the actor process's peak resident memory);

each also relative to the baseline, after a table of each run's remote calls (median ms per rollout, from the
timeline) that shows where the time goes. The PPO runs also train a critic (a second train actor, running beside the
actor), so PPO vs GRPO includes the critic's cost; the PPO rows against each other isolate the corrections.
The last line summarizes the ratios.

Run-to-run noise on a small machine is about 10 %, so by default it goes twice round the four runs, the second
time in reverse order (``--repeats``), and pools each configuration's rollouts, after a short untimed warm-up
run. Each run prints the load average, so a machine shared with other work shows.

Usage: python bench/corrections.py [--num-rollout 40] [--warmup 5] [--repeats 2] [--keep-logs] [-- flags...]
"""

from __future__ import annotations

from async_vs_sync import (  # bench/ is sys.path[0] when run as `python bench/corrections.py`
    MS,
    NUM_SAMPLES_KEY,
    RESPONSE_LENGTH_KEY,
    SAME_WORK,
    TRAIN_KEY,
    alternating_order,
    call_medians,
    median_metric,
    parse_options,
    profile_table,
    run_schedule,
    steady_records,
    training_argv,
    wall_per_rollout,
)

RSS_KEY = "perf/actor_peak_rss_mb"
BASELINE = "grpo"
RUNS = {  # name -> the flags that make the run
    BASELINE: ["--advantage-estimator", "grpo"],
    "ppo+rollout-logprobs": ["--advantage-estimator", "ppo", "--use-rollout-logprobs"],
    "ppo+tis": ["--advantage-estimator", "ppo", "--use-tis"],
    "ppo+keep-old-actor": ["--advantage-estimator", "ppo", "--keep-old-actor"],
}
PREPARE_CALL = "PolicyTrainer.prepare"
PROFILED_CALLS = [  # one rollout's remote calls, in the order they run (the critic's only in PPO)
    "RolloutManager.generate", "ValueTrainer.compute_values", PREPARE_CALL, "PolicyTrainer.train",
    "ValueTrainer.train", "PolicyTrainer.export_weights", "RolloutManager.load_weights",
]


def peak_rss_mb(runs: list[list[dict]]) -> float:
    """The largest actor peak RSS (MB) the runs reported (a process's peak RSS only grows)."""
    values = [record[RSS_KEY] for records in runs for record in records if record.get(RSS_KEY) is not None]
    if not values:
        raise ValueError(f"the run reported no {RSS_KEY}; this benchmark needs the actor's peak RSS metric")
    return max(values)


def run_costs(runs: list[list[dict]], medians: dict[str, float], warmup: int) -> dict[str, float]:
    """Per-rollout costs of one configuration's runs (pooled): wall (s), generated tokens (mean), perf/train_s (s),
    the actor's prepare (s, from ``medians``, the runs' call medians) and the actor's peak RSS (MB)."""
    if PREPARE_CALL not in medians:
        raise ValueError(f"Ray's task timeline has no {PREPARE_CALL} calls in the timed rollouts")
    tokens = [record[NUM_SAMPLES_KEY] * record[RESPONSE_LENGTH_KEY]
              for records in runs for record in steady_records(records, warmup)]
    return {
        "wall": wall_per_rollout(runs, warmup),
        "tokens": sum(tokens) / len(tokens),
        "train": median_metric(runs, TRAIN_KEY, warmup),
        "prepare": medians[PREPARE_CALL],
        "rss": peak_rss_mb(runs),
    }


def relative(costs: dict[str, dict[str, float]], baseline: str) -> dict[str, dict[str, float]]:
    """Each run's costs divided by the baseline run's, quantity by quantity."""
    return {name: {key: value / costs[baseline][key] for key, value in run.items()} for name, run in costs.items()}


def cost_table(costs: dict[str, dict[str, float]], ratios: dict[str, dict[str, float]]) -> list[str]:
    """Aligned lines, one per run: each quantity and its ratio to the baseline."""
    width = max(len(name) for name in costs)
    header = (f"  {'run'.ljust(width)}  {'wall ms/rollout':>18}  {'tokens/rollout':>18}  {'perf/train_s ms':>18}  "
              f"{'prepare ms':>16}  {'actor peak RSS MB':>20}")
    lines = [header]
    for name, run in costs.items():
        ratio = ratios[name]
        lines.append(
            f"  {name.ljust(width)}  {run['wall'] * MS:9.1f} ({ratio['wall']:.2f}x)  "
            f"{run['tokens']:9.1f} ({ratio['tokens']:.2f}x)  {run['train'] * MS:9.1f} ({ratio['train']:.2f}x)  "
            f"{run['prepare'] * MS:7.1f} ({ratio['prepare']:.2f}x)  "
            f"{run['rss']:11.1f} ({ratio['rss']:.2f}x)"
        )
    return lines


def summary_line(ratios: dict[str, dict[str, float]], baseline: str) -> str:
    """``vs async grpo without a correction (--lr 0: the same rollouts): <run> wall/rollout 1.52x (tokens 1.00x),
    peak RSS 1.01x; ...``."""
    parts = [f"{name} wall/rollout {run['wall']:.2f}x (tokens {run['tokens']:.2f}x), peak RSS {run['rss']:.2f}x"
             for name, run in ratios.items() if name != baseline]
    return f"vs async {baseline} without a correction ({' '.join(SAME_WORK)}: the same rollouts): " + "; ".join(parts)


def report(records: dict[str, list[list[dict]]], events: list[dict], warmup: int) -> list[str]:
    """The printed result: a profile of each run's remote calls, the cost table and the summary (last line)."""
    medians = {name: call_medians(events, runs, warmup) for name, runs in records.items()}
    costs = {name: run_costs(runs, medians[name], warmup) for name, runs in records.items()}
    ratios = relative(costs, BASELINE)
    profiles = {name: {**medians[name], "wall": costs[name]["wall"]} for name in records}
    num_runs = len(next(iter(records.values())))
    return [
        f"rollouts {warmup}.. of {num_runs} run(s) each (the first {warmup} are warm-up), medians:",
        *profile_table(profiles, [*PROFILED_CALLS, "wall"]),
        f"ratios to {BASELINE}:",
        *cost_table(costs, ratios),
        summary_line(ratios, BASELINE),
    ]


def main() -> None:
    options = parse_options(__doc__, default_num_rollout=40,
                            repeats_help="rounds over the four runs, every other one in reverse order, pooled; more "
                                         "damp a shared machine's noise")
    schedule = [(name, "async", training_argv(options.num_rollout, [*RUNS[name], *options.extra, *SAME_WORK]))
                for repeat in range(options.repeats) for name in alternating_order(list(RUNS), repeat)]
    records, events = run_schedule(schedule, options, "miles-bench-corrections-")
    print("\n".join(report(records, events, options.warmup)))


if __name__ == "__main__":
    main()
