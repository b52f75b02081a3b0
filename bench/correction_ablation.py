"""What each behavior-policy correction changes in learning, measured on the embedded default.

In one process and one Ray session it trains, with the same seeds and budget, twelve arms:

- sync PPO (``train.train``): the on-policy reference, never stale;
- async PPO (``train_async.train``) with ``--use-rollout-logprobs``, with ``--use-tis``, with ``--keep-old-actor``,
  and with no correction;
- async PPO with the TIS family and OPSM (docs/corrections.md): IcePop masking (upstream's ``icepop_function`` on
  [0.5, 2]), geometric sequence masking (``--rs-level geometric`` on [0.99, 1.01], SkyRL's default band, on top of
  token TIS), sequence-level TIS (``--tis-level sequence``), OPSM alone (refused by the contract like no
  correction, so run with the contract switched off like the uncorrected arm) and OPSM with TIS;
- async GRPO without a correction and with ``--use-tis``;

the async arms at ``--update-weights-interval`` 1 and 4 (sync PPO has no interval: it is the reference for both),
all with ``--num-steps-per-rollout 4``, so that the ratio and its clipping act after the first optimizer step.

The uncorrected async PPO arm (and OPSM alone) is exactly what ``train_async.py`` refuses. This script switches
the contract off for those arms only, inside its own process (``contract_switched_off``: it replaces
``train_async.validate_async_off_policy_correction`` and the actor's per-batch check for the duration of that one
call and restores them), and says so in its output. No flag or environment variable does this: a user cannot
start uncorrected async PPO.

For each arm it reports, as mean ± sample standard deviation over the seeds: the final eval accuracy (the
held-out sampled accuracy, mean of the last three evaluations, the last at the last rollout) and its ratio to
sync PPO, the reward (mean of the last 10 rollouts), the policy-vs-behavior KL, the denominator-vs-behavior KL,
the PPO clip fraction, the spread of the raw TIS weights exp(old - rollout) and their effective sample size
(means over the rollouts), and the wall time per rollout (median gap between rollouts, after the first two). A
value differs from sync PPO's "beyond the seed spread" when the means are more than two standard errors of the
difference apart (|delta| > 2 sqrt(sd_a^2/n_a + sd_ref^2/n_ref)); the table marks such accuracies and rewards
with *. It draws the eval-accuracy curves (mean over seeds, min-max band) as one PNG, prints the final eval
accuracy per arm relative to sync PPO, and the last line is the headline: the training reward (mean of the last 10
rollouts) per arm, mean ± sd over seeds (the held-out accuracy does not separate the arms at this budget).

Every run's slimmed metrics are written to RESULTS.json in --out after each run, so a stopped benchmark keeps
what it measured; ``--from-results`` prints the table and draws the figure from such a file without training.

Usage: python bench/correction_ablation.py [--quick] [--seeds 3] [--num-rollout 100] [--eval-interval 10]
       [--arms ARM ...] [--intervals 1 4] [--out DIR] [--from-results RESULTS.json] [--keep-logs]
       [-- flags for every run...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from async_vs_sync import (  # bench/ is sys.path[0] when run as `python bench/correction_ablation.py`
    MS,
    REPO_ROOT,
    bench_session,
    load_note,
    run_training,
    training_argv,
    wall_per_rollout,
)

REFERENCE = "sync-ppo"
UNCORRECTED_PPO = "ppo-uncorrected"
OPSM_ALONE = "ppo+opsm"  # refused like no correction: its denominator is the current actor's
CONTRACT_OFF_ARMS = (UNCORRECTED_PPO, OPSM_ALONE)
ARMS = {  # name -> (driver, the flags that make the arm)
    REFERENCE: ("sync", ["--advantage-estimator", "ppo"]),
    "ppo+rollout-logprobs": ("async", ["--advantage-estimator", "ppo", "--use-rollout-logprobs"]),
    "ppo+tis": ("async", ["--advantage-estimator", "ppo", "--use-tis"]),
    "ppo+keep-old-actor": ("async", ["--advantage-estimator", "ppo", "--keep-old-actor"]),
    UNCORRECTED_PPO: ("async", ["--advantage-estimator", "ppo"]),
    # the TIS family and OPSM (docs/corrections.md)
    "ppo+icepop": ("async", ["--advantage-estimator", "ppo", "--use-tis", "--custom-tis-function-path",
                             "miles.backends.training_utils.loss_hub.corrections.icepop_function",
                             "--tis-clip-low", "0.5", "--tis-clip", "2.0"]),
    "ppo+geo-mask": ("async", ["--advantage-estimator", "ppo", "--use-tis", "--rs-level", "geometric",
                               "--rs-lower-bound", "0.99", "--rs-upper-bound", "1.01"]),
    "ppo+seq-tis": ("async", ["--advantage-estimator", "ppo", "--use-tis", "--tis-level", "sequence"]),
    OPSM_ALONE: ("async", ["--advantage-estimator", "ppo", "--use-opsm"]),
    "ppo+opsm+tis": ("async", ["--advantage-estimator", "ppo", "--use-opsm", "--use-tis"]),
    "grpo": ("async", ["--advantage-estimator", "grpo"]),
    "grpo+tis": ("async", ["--advantage-estimator", "grpo", "--use-tis"]),
}
INTERVALS = (1, 4)
STEPS_PER_ROLLOUT = 4
# The smoke test: every arm once, at the interval whose staleness pattern (1, 2, 3, 4) exercises the most code.
QUICK = {"seeds": 1, "num_rollout": 4, "eval_interval": 2, "intervals": (4,),
         "extra": ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4"]}
EVAL_KEY = "eval/accuracy"
REWARD_KEY = "rollout/reward_mean"
REWARD_WINDOW = 10
FIGURE_DPI = 70  # keeps the committed figure under 200 KB
FINAL_EVALS = 3  # the final accuracy averages the last evaluations: one eval of 160 samples has a sd of ~0.03
WALL_WARMUP = 2  # rollouts left out of the wall time: start-up work (actors, the first push)
RUN_MEANS = {  # column -> the metric averaged over a run's rollouts
    "pi-vs-behavior KL": "off_policy/policy_behavior_kl",
    "denom-vs-behavior KL": "off_policy/denominator_behavior_kl",
    "clip frac": "train/pg_clipfrac",
    "TIS w std": "off_policy/tis_raw_std",
    "ESS": "off_policy/ess",
}
KEPT_KEYS = ("rollout_id", "time", EVAL_KEY, REWARD_KEY, "off_policy/correction", *RUN_MEANS.values())


def arm_label(arm: str, interval: int | None) -> str:
    return arm if interval is None else f"{arm} N={interval}"


def arm_configs(intervals: tuple[int, ...], arms: tuple[str, ...] | None = None) -> list[tuple[str, int | None]]:
    """(arm, interval) for every run of one seed: sync PPO once (no interval), each async arm at each interval
    (only the ``arms`` named, sync PPO always, when given)."""
    chosen = [arm for arm in ARMS if arms is None or arm in arms or arm == REFERENCE]
    return [(arm, None if ARMS[arm][0] == "sync" else interval)
            for arm in chosen for interval in (intervals if ARMS[arm][0] == "async" else (None,))]


@contextlib.contextmanager
def contract_switched_off():
    """Within this block, ``train_async.train`` skips the async off-policy contract: for the arms it refuses (no
    correction, OPSM alone).

    It replaces the name ``validate_async_off_policy_correction`` in ``train_async``'s namespace (where ``train``
    looks it up) with a no-op, and the actor class ``miles.ray.run`` places with a subclass whose per-batch contract
    check (``BatchGuard.check_contract``, called by ``prepare``) does nothing, and restores
    both on every exit path. It exists only in this benchmark's process: no flag or environment variable reaches it.
    """
    import miles.ray.run
    import train_async
    from miles.backends.train_process import PolicyTrainer
    from miles.guard.batch import BatchGuard

    class ContractOffGuard(BatchGuard):  # local classes: Ray ships them to the actor by value
        def check_contract(self, rollout_id: int, staleness: int) -> None:
            pass  # this arm trains uncorrected stale PPO on purpose

    class UncorrectedAblationTrainer(PolicyTrainer):
        def __init__(self, args, num_threads: int = 1) -> None:
            super().__init__(args, num_threads)
            self.guard = ContractOffGuard(self.guard.config)

    original = train_async.validate_async_off_policy_correction, miles.ray.run.PolicyTrainer
    train_async.validate_async_off_policy_correction = lambda args: None
    miles.ray.run.PolicyTrainer = UncorrectedAblationTrainer
    print("[bench] the async off-policy contract is SWITCHED OFF for this run only, inside this benchmark's process "
          "(train_async.validate_async_off_policy_correction replaced, and the actor's per-batch check); no flag or "
          "environment variable can do this", flush=True)
    try:
        yield
    finally:
        train_async.validate_async_off_policy_correction, miles.ray.run.PolicyTrainer = original


def run_arm(arm: str, interval: int | None, seed: int, settings: dict, log_dir: Path) -> list[dict]:
    """Train one arm with one seed in this process; return its records, keeping only the keys the report reads."""
    driver, arm_flags = ARMS[arm]
    interval_flags = [] if interval is None else ["--update-weights-interval", str(interval)]
    argv = training_argv(settings["num_rollout"], [
        *arm_flags, *interval_flags, "--num-steps-per-rollout", str(STEPS_PER_ROLLOUT),
        "--eval-interval", str(settings["eval_interval"]), "--seed", str(1234 + seed),
        "--rollout-seed", str(42 + seed), *settings["extra"]])
    switch = contract_switched_off() if arm in CONTRACT_OFF_ARMS else contextlib.nullcontext()
    with switch:
        records = run_training(driver, argv, log_dir)
    return [{key: record[key] for key in KEPT_KEYS if key in record} for record in records]


def run_all(settings: dict, results_path: Path, keep_logs: bool) -> dict:
    """Every arm for every seed, seed by seed (so a stopped run holds whole seeds), in one Ray session; the results
    file is rewritten after each run."""
    results = {"settings": settings, "runs": {}}
    configs = arm_configs(tuple(settings["intervals"]), settings.get("arms"))
    total, done, start = len(configs) * settings["seeds"], 0, time.perf_counter()
    with bench_session(keep_logs, "miles-bench-ablation-") as log_root:
        for seed in range(settings["seeds"]):
            for arm, interval in configs:
                label = arm_label(arm, interval)
                log_dir = log_root / f"seed{seed}-{label.replace('+', '-').replace(' ', '-').replace('=', '')}"
                print(f"[bench] {label}, seed {seed} ({done + 1}/{total})", flush=True)
                results["runs"].setdefault(label, {})[str(seed)] = run_arm(arm, interval, seed, settings, log_dir)
                results_path.write_text(json.dumps(results))
                done += 1
                print(f"[bench] {done}/{total} runs in {time.perf_counter() - start:.0f} s; {load_note()}", flush=True)
    return results


def finite(values) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def run_numbers(records: list[dict]) -> dict[str, float | None]:
    """One run's numbers: final eval accuracy (mean of the last FINAL_EVALS evaluations), reward of the last
    rollouts, the RUN_MEANS and the wall ms per rollout."""
    evals = [record[EVAL_KEY] for record in records if record.get(EVAL_KEY) is not None]
    rewards = finite(record.get(REWARD_KEY) for record in records)
    numbers: dict[str, float | None] = {
        "final eval": statistics.fmean(evals[-FINAL_EVALS:]) if evals else None,
        "reward": statistics.fmean(rewards[-REWARD_WINDOW:]) if rewards else None,
    }
    for column, key in RUN_MEANS.items():
        values = finite(record.get(key) for record in records)
        numbers[column] = statistics.fmean(values) if values else None
    numbers["wall ms"] = (wall_per_rollout([records], WALL_WARMUP) * MS
                          if len(records) >= WALL_WARMUP + 2 else None)
    return numbers


def mean_and_sd(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def beyond_seed_spread(arm: list[float], reference: list[float]) -> bool | None:
    """|mean difference| > 2 standard errors of the difference; None with fewer than two seeds on either side."""
    if len(arm) < 2 or len(reference) < 2:
        return None
    (arm_mean, arm_sd), (ref_mean, ref_sd) = mean_and_sd(arm), mean_and_sd(reference)
    return abs(arm_mean - ref_mean) > 2 * math.sqrt(arm_sd**2 / len(arm) + ref_sd**2 / len(reference))


def arm_numbers(results: dict) -> dict[str, dict[str, list[float]]]:
    """label -> column -> the per-seed values (seeds whose value is unknown left out)."""
    table: dict[str, dict[str, list[float]]] = {}
    for label, seeds in results["runs"].items():
        per_seed = [run_numbers(records) for records in seeds.values()]
        table[label] = {column: [n[column] for n in per_seed if n[column] is not None] for column in per_seed[0]}
    return table


def cell(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    mean, sd = mean_and_sd(values)
    return f"{mean:.{digits}f}" + (f" ± {sd:.{digits}f}" if len(values) > 1 else "")


def compared_cell(values: list[float], reference: list[float], digits: int) -> str:
    """``cell`` with `` *`` appended when the values differ from the reference's beyond the seed spread."""
    return cell(values, digits) + (" *" if values is not reference and beyond_seed_spread(values, reference) else "")


def report_rows(results: dict) -> tuple[list[str], str]:
    """A markdown table, one row per arm (sync PPO, then each interval's arms), the accuracy line and the headline."""
    table = arm_numbers(results)
    reference = table[REFERENCE]
    ref_mean = statistics.fmean(reference["final eval"])
    header = ["arm", "seeds", "final eval acc", "vs sync", "reward (last 10)", *RUN_MEANS, "wall ms/rollout"]
    digits = {"pi-vs-behavior KL": 4, "denom-vs-behavior KL": 4, "clip frac": 3, "TIS w std": 3, "ESS": 3}
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    ratios = []
    for label, columns in table.items():
        finals = columns["final eval"]
        ratio = statistics.fmean(finals) / ref_mean if finals and ref_mean > 0 else None
        if label != REFERENCE and ratio is not None:
            ratios.append(f"{label} {ratio:.2f}x")
        row = [label, str(len(results["runs"][label])), compared_cell(finals, reference["final eval"], 3),
               "-" if ratio is None else f"{ratio:.2f}x", compared_cell(columns["reward"], reference["reward"], 3),
               *(cell(columns[c], digits[c]) for c in RUN_MEANS), cell(columns["wall ms"], 0)]
        lines.append("| " + " | ".join(row) + " |")
    rewards = "; ".join(f"{label} {cell(columns['reward'], 3)}" for label, columns in table.items())
    headline = f"training reward (mean of the last {REWARD_WINDOW} rollouts, mean ± sd over seeds): {rewards}"
    return lines, [f"final eval accuracy relative to sync PPO ({ref_mean:.3f}): " + "; ".join(ratios), headline]


Curve = tuple[list[float], list[float], list[float], list[float]]  # x, mean, min, max over seeds


def over_seeds(by_seed: list[dict[int, float]]) -> Curve:
    """(x, mean, min, max) over seeds of per-seed ``{rollout id: value}`` curves, at the ids every seed has."""
    common = sorted(set.intersection(*(set(curve) for curve in by_seed)))
    values = [[curve[x] for curve in by_seed] for x in common]
    return ([float(x) for x in common], [statistics.fmean(v) for v in values], [min(v) for v in values],
            [max(v) for v in values])


def eval_curves(seeds: dict[str, list[dict]]) -> Curve:
    """The eval accuracy over seeds, at the rollouts every seed evaluated."""
    return over_seeds([{r["rollout_id"]: r[EVAL_KEY] for r in records if r.get(EVAL_KEY) is not None}
                       for records in seeds.values()])


def reward_curves(seeds: dict[str, list[dict]]) -> Curve:
    """The reward over seeds, each seed's averaged over blocks of REWARD_WINDOW rollouts (x = a block's last id)."""
    by_seed = []
    for records in seeds.values():
        blocks = [records[start:start + REWARD_WINDOW] for start in range(0, len(records), REWARD_WINDOW)]
        rewards = [(block[-1]["rollout_id"], finite(r.get(REWARD_KEY) for r in block)) for block in blocks
                   if len(block) == REWARD_WINDOW]
        by_seed.append({rollout_id: statistics.fmean(values) for rollout_id, values in rewards if values})
    return over_seeds(by_seed)


def draw_figure(results: dict, path: Path) -> Path:
    """Reward and eval-accuracy curves, one column per interval, sync PPO drawn in each (the project's plotting
    code)."""
    from miles.tracking.plot import plot_bands

    panels = {}
    intervals = results["settings"]["intervals"]
    for metric, curves in ((f"reward (mean of {REWARD_WINDOW} rollouts)", reward_curves),
                           ("eval accuracy (held-out)", eval_curves)):
        for interval in intervals:
            panel = {REFERENCE: curves(results["runs"][REFERENCE])}
            for label, seeds in results["runs"].items():
                if label.endswith(f" N={interval}"):
                    panel[label.removesuffix(f" N={interval}")] = curves(seeds)
            panels[f"{metric}, --update-weights-interval {interval}"] = panel
    counts = sorted({len(seeds) for seeds in results["runs"].values()})  # a stopped run: some arms have fewer
    seeds = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    title = (f"mean and min-max over {seeds} seed(s); {STEPS_PER_ROLLOUT} optimizer steps per rollout; "
             "sampled at temperature 1")
    return plot_bands(panels, path, title, columns=len(intervals), reference=REFERENCE, dpi=FIGURE_DPI)


def report(results: dict, figure_path: Path) -> list[str]:
    """The printed result: the settings, the table, the figure's path and (last) the headline."""
    rows, (accuracy_line, headline) = report_rows(results)
    figure = draw_figure(results, figure_path)
    return [
        f"settings: {json.dumps(results['settings'])}",
        f"{', '.join(CONTRACT_OFF_ARMS)}: async PPO with the contract switched off inside this benchmark's process "
        "only",
        "mean ± sd over seeds; * beyond the seed spread: |mean - sync PPO's| > 2 standard errors of the difference",
        *rows,
        f"figure: {figure}",
        accuracy_line,
        headline,
    ]


def parse_options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke test: {QUICK['seeds']} seed, {QUICK['num_rollout']} rollouts of 4 prompts x 4 "
                             "samples, every arm once (async arms at --update-weights-interval 4 only)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per arm (default: %(default)s)")
    parser.add_argument("--num-rollout", type=int, default=100, help="rollouts per run (default: %(default)s)")
    parser.add_argument("--eval-interval", type=int, default=10,
                        help="evaluate every N rollouts; must divide --num-rollout (default: %(default)s)")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=None,
                        help="train only these arms (sync PPO, the reference, always runs) (default: all)")
    parser.add_argument("--intervals", nargs="+", type=int, default=list(INTERVALS),
                        help="--update-weights-interval values of the async arms (default: %(default)s)")
    parser.add_argument("--out", default=None,
                        help="folder for RESULTS.json and the figure (default: a new temporary folder)")
    parser.add_argument("--from-results", default=None, help="report from this RESULTS.json instead of training")
    parser.add_argument("--keep-logs", action="store_true", help="keep the run folders (their path is printed)")
    parser.add_argument("extra", nargs="*", help="training flags for every run, after '--' (e.g. -- --lr 1e-4)")
    options = parser.parse_args()
    options.intervals = tuple(options.intervals)
    if options.quick:
        options.intervals = QUICK["intervals"]
        options.seeds, options.num_rollout, options.eval_interval = (QUICK["seeds"], QUICK["num_rollout"],
                                                                     QUICK["eval_interval"])
        options.extra = [*QUICK["extra"], *options.extra]
    if options.seeds < 1 or options.eval_interval < 1 or options.num_rollout % options.eval_interval:
        parser.error(f"--seeds {options.seeds}, --num-rollout {options.num_rollout}, --eval-interval "
                     f"{options.eval_interval}: need at least one seed, and an eval interval >= 1 that divides "
                     "--num-rollout (so every run evaluates at its last rollout)")
    return options


def main() -> None:
    options = parse_options()
    out = Path(options.out) if options.out else Path(tempfile.mkdtemp(prefix="miles-ablation-"))
    out.mkdir(parents=True, exist_ok=True)
    if options.from_results:
        results = json.loads(Path(options.from_results).read_text())
    else:
        settings = {"seeds": options.seeds, "num_rollout": options.num_rollout, "intervals": list(options.intervals),
                    "eval_interval": options.eval_interval, "steps_per_rollout": STEPS_PER_ROLLOUT,
                    "extra": options.extra, "arms": options.arms}
        results = run_all(settings, out / "RESULTS.json", options.keep_logs)
    missing = [arm_label(arm, interval) for arm, interval in arm_configs(tuple(results["settings"]["intervals"]),
                                                                        results["settings"].get("arms"))
               if arm_label(arm, interval) not in results["runs"]]
    if missing:
        print(f"[bench] partial results: no run of {missing}", flush=True)
    print("\n".join(report(results, out / "correction_ablation.png")))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    main()
