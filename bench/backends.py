"""The megatron training backend against the torch backend on the embedded default: time per rollout.

In one process and one Ray session it runs the same configuration (the default: sync GRPO on the embedded model
and task, where training is on the loop's critical path) with ``--train-backend torch`` and ``--train-backend
megatron``, leaves out the first ``--warmup`` rollouts (and so start-up: importing megatron-core and building
GPTModel happen before rollout 0), and prints a per-rollout profile of both from Ray's task timeline (how long
each remote call takes, how long the actor works) and the ratio of the wall time per rollout, megatron / torch,
as the last line.

Run-to-run noise on a small machine is about 10 %, so by default it runs the two backends twice, the second time
in reverse order (``--repeats``), and pools their rollouts, after a short untimed warm-up run.

Usage: python bench/backends.py [--num-rollout 40] [--warmup 5] [--repeats 2] [--keep-logs] [-- flags...]
"""

from __future__ import annotations

from async_vs_sync import (  # bench/ is sys.path[0] when run as `python bench/backends.py`
    ACTOR_WORK,
    MS,
    PROFILED_CALLS,
    alternating_order,
    parse_options,
    profile_runs,
    profile_table,
    run_schedule,
    training_argv,
)

BACKENDS = ("torch", "megatron")


def report(runs: dict[str, list[list[dict]]], events: list[dict], warmup: int) -> list[str]:
    """The profile table and the ratio line (last)."""
    profiles = {name: profile_runs(events, name_runs, warmup, PROFILED_CALLS, ACTOR_WORK)
                for name, name_runs in runs.items()}
    torch_profile, megatron_profile = profiles["torch"], profiles["megatron"]
    ratio = megatron_profile["wall"] / torch_profile["wall"]
    return [
        f"rollouts {warmup}.. of {len(runs['torch'])} run(s) each (the first {warmup} are warm-up), medians:",
        *profile_table(profiles, list(torch_profile)),
        (f"megatron/torch time per rollout {ratio:.2f}x ({megatron_profile['wall'] * MS:.1f} ms vs "
         f"{torch_profile['wall'] * MS:.1f} ms, start-up excluded; goal: within 1.5x)"),
    ]


def main() -> None:
    options = parse_options(__doc__, default_num_rollout=40,
                            repeats_help="rounds over both backends, every other one in reverse order, pooled")
    schedule = [(backend, "sync", training_argv(options.num_rollout, ["--train-backend", backend, *options.extra]))
                for repeat in range(options.repeats) for backend in alternating_order(list(BACKENDS), repeat)]
    runs, events = run_schedule(schedule, options, "miles-bench-backends-")
    print("\n".join(report(runs, events, options.warmup)))


if __name__ == "__main__":
    main()
