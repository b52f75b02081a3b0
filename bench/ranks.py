"""Ranks against one process on the embedded default (megatron backend, sync GRPO): time per rollout.

In one Ray session it runs the same configuration with the actor as one process, as tensor-parallel size 2 (two
ranks, each with half of every layer) and as data-parallel size 2 (two ranks, each with half of every optimizer
step's samples), leaves out the first ``--warmup`` rollouts (start-up: two processes, imports, the rendezvous),
and prints, per kind, the median wall time per rollout and the loop's own timings (generation, the actor's
prepare and optimizer steps, the weight push), then one ratio line per kind (last lines).

On 2 cores no speed-up is expected: both ranks share the cores the one process had, and each adds its
collectives (TP: an all-gather of the logits per forward pass and a gather of the weights per push; DP: one
gradient all-reduce per step, and the denominator pass, which every rank computes over the whole rollout).

Usage: python bench/ranks.py [--num-rollout 25] [--warmup 5] [--repeats 2] [--keep-logs] [-- flags...]
"""

from __future__ import annotations

from async_vs_sync import (  # bench/ is sys.path[0] when run as `python bench/ranks.py`
    MS,
    alternating_order,
    median_metric,
    parse_options,
    profile_table,
    run_schedule,
    training_argv,
    wall_per_rollout,
)

# 16 prompts x 8 samples = 128 samples, one optimizer step; DP=2 takes 64 per rank in one micro-batch.
KINDS = {
    "one process": [],
    "TP=2": ["--actor-num-gpus-per-node", "2", "--tensor-model-parallel-size", "2"],
    "DP=2": ["--actor-num-gpus-per-node", "2", "--micro-batch-size", "64"],
}
TIMINGS = ("perf/generate_s", "perf/prepare_s", "perf/train_s", "perf/last_push_s")


def report(runs: dict[str, list[list[dict]]], warmup: int) -> list[str]:
    """The timing table and one ratio line per multi-rank kind (last)."""
    profiles = {kind: {"wall": wall_per_rollout(kind_runs, warmup),
                       **{key: median_metric(kind_runs, key, warmup) for key in TIMINGS}}
                for kind, kind_runs in runs.items()}
    one = profiles["one process"]["wall"]
    return [
        f"rollouts {warmup}.. of each run (the first {warmup} are warm-up), medians:",
        *profile_table(profiles, ["wall", *TIMINGS]),
        *(f"{kind}/one process time per rollout {profiles[kind]['wall'] / one:.2f}x "
          f"({profiles[kind]['wall'] * MS:.1f} ms vs {one * MS:.1f} ms, start-up excluded)"
          for kind in KINDS if kind != "one process"),
    ]


def main() -> None:
    options = parse_options(__doc__, default_num_rollout=25, repeats_help="rounds over the kinds, every other one "
                            "in reverse order, pooled")
    schedule = [(kind, "sync", training_argv(options.num_rollout, ["--train-backend", "megatron", *KINDS[kind],
                                                                   *options.extra]))
                for repeat in range(options.repeats) for kind in alternating_order(list(KINDS), repeat)]
    runs, _ = run_schedule(schedule, options, "miles-bench-ranks-")
    print("\n".join(report(runs, options.warmup)))


if __name__ == "__main__":
    main()
