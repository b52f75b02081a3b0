"""What the runtime guard costs, as a fraction of the actor's training time per rollout.

Runs async PPO with --keep-old-actor (the mode with the most checks: provenance, the snapshot's recomputed
fingerprint, the snapshot count, the denominator tolerance) and async GRPO with --use-tis on the embedded default,
and reads `perf/guard_s` (time spent in the guard's checks, measured in the actor) and `perf/train_s` (the actor's
optimizer steps) from each run's metrics. Prints the median ratio per mode; the last line is the worst one
(goal <= 2 %). Usage: python bench/guard_cost.py [--num-rollout 40]
"""

import argparse
import asyncio
import statistics

from async_vs_sync import bench_session  # bench/ is sys.path[0] when run as `python bench/guard_cost.py`

import train_async
from miles.tracking.metrics import read_metrics
from miles.utils.arguments import parse_args

MODES = {"ppo --keep-old-actor": ["--advantage-estimator", "ppo", "--keep-old-actor"],
         "grpo --use-tis": ["--advantage-estimator", "grpo", "--use-tis"]}


def guard_fraction(flags: list[str], num_rollout: int, log_dir: str) -> tuple[float, float, float]:
    args = parse_args(argv=[*flags, "--num-rollout", str(num_rollout), "--eval-interval", "0",
                            "--no-use-tensorboard", "--log-dir", log_dir])
    asyncio.run(train_async.train(args))
    records = read_metrics(log_dir)[2:]  # skip warm-up
    guard = statistics.median(r["perf/guard_s"] for r in records)
    step = statistics.median(r["perf/train_s"] for r in records)
    return guard, step, guard / step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-rollout", type=int, default=40)
    options = parser.parse_args()
    fractions = {}
    with bench_session(keep_logs=False, folder_prefix="miles-bench-guard-") as folder:
        for index, (name, flags) in enumerate(MODES.items()):
            guard, step, fractions[name] = guard_fraction(flags, options.num_rollout, f"{folder}/{index}")
            print(f"{name}: guard {guard * 1e3:.3f} ms, training {step * 1e3:.1f} ms per rollout "
                  f"-> {100 * fractions[name]:.3f} %", flush=True)
    worst = max(fractions, key=fractions.get)
    print(f"runtime guard costs at most {100 * fractions[worst]:.3f} % of the actor's step time ({worst}; goal <= 2 %)")


if __name__ == "__main__":
    main()
