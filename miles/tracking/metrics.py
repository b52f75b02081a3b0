"""Per-rollout metrics of a run: a crash-safe JSONL file, TensorBoard, a tqdm bar and an end-of-run summary.

A run folder holds::

    config.json     the flags of the run (JSON-safe)
    metrics.jsonl   one line per rollout: {"rollout_id": k, "time": <unix seconds>, **metrics}
    tb/             TensorBoard events, step = rollout id (only with use_tensorboard)
    wandb/          with --use-wandb: the wandb run's files (offline-run-* without a key), the same numbers,
                    step = rollout id, unless --wandb-dir puts them elsewhere (``wandb_run.py``)
    summary.json    what ``MetricsTracker.close`` returns

Metric names are slash-grouped (``rollout/reward_mean``, ``eval/accuracy``, ``train/pg_loss``,
``perf/generate_s``, ``off_policy/staleness_mean``, ...). The tracker stores whatever it is given; only the
progress bar and the summary read the few names below. The summary reduces each ``off_policy/*`` metric over the
run: ``*_max`` names by their maximum, ``*_min`` names by their minimum, the others by their mean.

Non-finite floats become ``null`` in the JSON files (JSON has no NaN), and are kept as they are in TensorBoard,
which stores and shows them: a NaN loss should be seen, not hidden.

A resumed run that logs into the same folder appends to ``metrics.jsonl`` (``read_metrics`` lets a later line
win for a rollout id logged twice), purges TensorBoard events from ``start_rollout_id`` on, and rewrites
``config.json`` and ``summary.json`` (the summary covers the rollouts this process logged).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from miles.tracking.wandb_run import WandbRun, WandbSettings
from miles.utils.errors import MilesConfigError

CONFIG_FILENAME = "config.json"
METRICS_FILENAME = "metrics.jsonl"
SUMMARY_FILENAME = "summary.json"
TENSORBOARD_SUBDIR = "tb"
RESERVED_KEYS = ("rollout_id", "time")
SECRET_CONFIG_KEYS = ("wandb_key",)

REWARD_MEAN_KEY = "rollout/reward_mean"
NUM_SAMPLES_KEY = "rollout/num_samples"
EVAL_ACCURACY_KEY = "eval/accuracy"
STALENESS_MEAN_KEY = "off_policy/staleness_mean"
OFF_POLICY_PREFIX = "off_policy/"
# The off-policy numbers the printed summary shows (summary.json keeps every one): what the correction was, how
# stale the data was, whether the denominator matched the behavior policy, and how far the policy drifted.
PRINTED_OFF_POLICY = (
    "off_policy/correction",
    "off_policy/staleness_max",
    "off_policy/denominator_behavior_abs_diff_max",
    "off_policy/tis_raw_mean",
    "off_policy/ess",
    "off_policy/policy_behavior_kl",
    "off_policy/num_snapshots",
)
SUMMARY_WINDOW = 10  # rollouts averaged at each end of the reward curve


def default_log_dir(driver: str, estimator: str) -> str:
    """``runs/<YYYYmmdd-HHMMSS>-<driver>-<estimator>``, in local time."""
    return f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{driver}-{estimator}"


def to_plain(value: Any) -> Any:
    """Python scalars and containers from numpy or torch values (``.tolist()``); anything unknown becomes ``str``.

    Non-finite floats stay as they are (TensorBoard takes them); ``to_json_safe`` turns them into ``None``.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "tolist"):  # numpy scalars and arrays, torch tensors
        return to_plain(value.tolist())
    if isinstance(value, dict):
        return {str(key): to_plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_plain(item) for item in value]
    return str(value)  # Path, enum, a function given by path, ...


def to_json_safe(value: Any) -> Any:
    """``to_plain(value)`` with every NaN or ±inf replaced by ``None``, so ``json.dumps(allow_nan=False)`` holds."""
    value = to_plain(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: to_json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_json_safe(item) for item in value]
    return value


def is_number(value: Any) -> bool:
    """True for a Python int or float (bools included: they plot as 0/1), False for strings, None, lists."""
    return isinstance(value, (int, float))


def _finite_numbers(values: list) -> list[float]:
    return [float(value) for value in values if is_number(value) and math.isfinite(value)]


def _mean_or_none(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _over_rollouts(name: str, values: list[float]) -> float:
    """A per-rollout metric over the run: the worst case for ``*_max``/``*_min`` names, else the mean."""
    if name.endswith("_max"):
        return max(values)
    if name.endswith("_min"):
        return min(values)
    return sum(values) / len(values)


def progress_postfix(
    reward_mean: float | None,
    eval_accuracy: float | None,
    staleness_mean: float | None,
    samples_per_s: float | None,
) -> dict[str, str]:
    """The bar's postfix: each value that is known, formatted short; unknown ones are left out."""
    fields = {"reward": reward_mean, "eval": eval_accuracy, "stale": staleness_mean}
    postfix = {name: f"{value:.3f}" for name, value in fields.items() if value is not None}
    if samples_per_s is not None:
        postfix["samples/s"] = f"{samples_per_s:.1f}"
    return postfix


class MetricsTracker:
    """Writes one run folder (see the module docstring) and shows a progress bar over rollouts.

    Use as a context manager, so that the files and writers are closed on every exit path::

        with MetricsTracker(log_dir, use_tensorboard, total_rollouts, start_rollout_id, vars(args), "train") as t:
            for rollout_id in range(start_rollout_id, total_rollouts):
                t.log(rollout_id, metrics)
        print(format_summary(t.close()))  # close() is idempotent
    """

    def __init__(
        self,
        log_dir: str,
        use_tensorboard: bool,
        total_rollouts: int,
        start_rollout_id: int,
        config: dict,
        driver: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        wandb: WandbSettings | None = None,
    ):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.log_dir / METRICS_FILENAME
        self._clock = clock
        self._start_time = clock()
        self._last_log_time: float | None = None
        self._summary: dict | None = None
        config = {name: ("<redacted>" if name in SECRET_CONFIG_KEYS and value else value)
                  for name, value in config.items()}  # config.json and the wandb config never hold a key
        config_text = json.dumps(to_json_safe(config), indent=2, allow_nan=False)
        (self.log_dir / CONFIG_FILENAME).write_text(config_text)
        self._tb_writer = self._open_tensorboard(start_rollout_id) if use_tensorboard else None
        if self._tb_writer is not None:
            self._tb_writer.add_text("config", f"```\n{config_text}\n```")  # markdown code block in TB's Text tab
        self._wandb = WandbRun.start(wandb, self.log_dir, to_json_safe(config)) if wandb is not None else None
        self._metrics_file = self.metrics_path.open("a", encoding="utf-8")
        self._bar = tqdm(
            total=total_rollouts, initial=start_rollout_id, desc=driver, unit="rollout", dynamic_ncols=True
        )
        self._rollouts_logged = 0
        self._rewards: list[float] = []
        self._eval_accuracies: list[float] = []
        self._latest_eval_accuracy: float | None = None
        self._latest_staleness: float | None = None
        self._off_policy_numbers: dict[str, list[float]] = {}
        self._off_policy_labels: dict[str, str] = {}

    def _open_tensorboard(self, start_rollout_id: int):
        # torch only when TensorBoard is wanted
        from torch.utils.tensorboard import SummaryWriter

        # purge_step hides events a crashed run wrote at or after the rollout this run resumes from.
        purge_step = start_rollout_id if start_rollout_id > 0 else None
        return SummaryWriter(log_dir=str(self.log_dir / TENSORBOARD_SUBDIR), purge_step=purge_step, flush_secs=10)

    def __enter__(self) -> MetricsTracker:
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> bool:
        self.close()
        return False  # never swallow the exception

    def log(self, rollout_id: int, metrics: dict) -> None:
        """Append ``{"rollout_id", "time", **metrics}`` to metrics.jsonl (flushed), mirror numbers to TensorBoard,
        and advance the bar to ``rollout_id + 1``."""
        if self._summary is not None:
            raise RuntimeError(
                f"MetricsTracker for {self.log_dir} is closed; log(rollout_id={rollout_id}) came after close()"
            )
        clashes = [key for key in RESERVED_KEYS if key in metrics]
        if clashes:
            raise ValueError(f"metric names {clashes} are reserved by the tracker's record; rename those metrics")
        plain_metrics = {str(name): to_plain(value) for name, value in metrics.items()}
        record = {"rollout_id": int(rollout_id), "time": time.time(), **plain_metrics}
        self._metrics_file.write(json.dumps(to_json_safe(record), allow_nan=False) + "\n")
        self._metrics_file.flush()  # a crash loses at most the rollout being written
        numbers = {name: float(value) for name, value in plain_metrics.items() if is_number(value)}
        if self._tb_writer is not None:
            for name, value in numbers.items():
                self._tb_writer.add_scalar(name, value, global_step=int(rollout_id))
        if self._wandb is not None:
            self._wandb.log(int(rollout_id), numbers)
        self._accumulate(plain_metrics)
        now = self._clock()
        samples_per_s = self._throughput(plain_metrics.get(NUM_SAMPLES_KEY), now)
        self._last_log_time = now
        self._update_bar(rollout_id, plain_metrics.get(REWARD_MEAN_KEY), samples_per_s)

    def _throughput(self, num_samples: Any, now: float) -> float | None:
        """Samples per second over the wall time since the previous log; unknown at the first log (no interval)."""
        if self._last_log_time is None or not is_number(num_samples) or now <= self._last_log_time:
            return None
        return float(num_samples) / (now - self._last_log_time)

    def _accumulate(self, metrics: dict) -> None:
        """Keep what the bar and the summary need: rewards, eval accuracies and the off_policy/* values."""
        self._rollouts_logged += 1
        self._rewards += _finite_numbers([metrics.get(REWARD_MEAN_KEY)])
        new_eval = _finite_numbers([metrics.get(EVAL_ACCURACY_KEY)])
        self._eval_accuracies += new_eval
        self._latest_eval_accuracy = new_eval[-1] if new_eval else self._latest_eval_accuracy
        new_staleness = _finite_numbers([metrics.get(STALENESS_MEAN_KEY)])
        self._latest_staleness = new_staleness[-1] if new_staleness else self._latest_staleness
        for name, value in metrics.items():
            if not name.startswith(OFF_POLICY_PREFIX):
                continue
            numbers = self._off_policy_numbers.setdefault(name, [])
            if isinstance(value, str):
                self._off_policy_labels[name] = value  # e.g. the correction in effect
            else:
                numbers += _finite_numbers([value])

    def _update_bar(self, rollout_id: int, reward_mean: Any, samples_per_s: float | None) -> None:
        reward = float(reward_mean) if is_number(reward_mean) and math.isfinite(reward_mean) else None
        postfix = progress_postfix(reward, self._latest_eval_accuracy, self._latest_staleness, samples_per_s)
        self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(max(0, int(rollout_id) + 1 - self._bar.n))

    def close(self) -> dict:
        """Close the bar, the JSONL file, the TensorBoard writer and the wandb run; write and return the summary
        (idempotent)."""
        if self._summary is not None:
            return self._summary
        self._summary = self._build_summary()
        try:
            self._bar.close()
            self._metrics_file.close()
            if self._tb_writer is not None:
                self._tb_writer.close()
            if self._wandb is not None:
                self._wandb.finish()
        finally:
            summary_text = json.dumps(to_json_safe(self._summary), indent=2, allow_nan=False)
            (self.log_dir / SUMMARY_FILENAME).write_text(summary_text)
        return self._summary

    def _build_summary(self) -> dict:
        window = min(SUMMARY_WINDOW, len(self._rewards))
        off_policy: dict[str, float | str | None] = {}
        for name, numbers in self._off_policy_numbers.items():
            off_policy[name] = _over_rollouts(name, numbers) if numbers else self._off_policy_labels.get(name)
        return {
            "log_dir": str(self.log_dir),
            "rollouts_logged": self._rollouts_logged,
            "wall_time_s": self._clock() - self._start_time,
            "reward_window": window,
            "reward_mean_first_10": _mean_or_none(self._rewards[:window]),
            "reward_mean_last_10": _mean_or_none(self._rewards[len(self._rewards) - window :]),
            "eval_accuracy_best": max(self._eval_accuracies, default=None),
            "eval_accuracy_last": self._eval_accuracies[-1] if self._eval_accuracies else None,
            "off_policy": off_policy,
        }


def _format_value(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_summary(summary: dict) -> str:
    """A few aligned ``label  value`` lines for the end of a run (the off-policy ones in ``PRINTED_OFF_POLICY``);
    lines whose value is unknown are left out."""
    window = summary.get("reward_window", SUMMARY_WINDOW)
    rows = [
        ("rollouts logged", summary.get("rollouts_logged")),
        ("wall time", f"{summary['wall_time_s']:.1f} s" if summary.get("wall_time_s") is not None else None),
        (f"reward mean, first {window} rollouts", summary.get("reward_mean_first_10")),
        (f"reward mean, last {window} rollouts", summary.get("reward_mean_last_10")),
        ("eval accuracy, best", summary.get("eval_accuracy_best")),
        ("eval accuracy, last", summary.get("eval_accuracy_last")),
    ]
    off_policy = summary.get("off_policy", {})
    rows += [(name, off_policy[name]) for name in PRINTED_OFF_POLICY if name in off_policy]
    rows = [(label, value) for label, value in rows if value is not None]
    width = max(len(label) for label, _ in rows) if rows else 0
    lines = [f"run summary ({summary.get('log_dir', '?')})"]
    lines += [f"  {label.ljust(width)}  {_format_value(value)}" for label, value in rows]
    if summary.get("log_dir"):
        lines.append(f"  curves: python -m miles.tracking.plot {summary['log_dir']}")
    return "\n".join(lines)


def _parse_metrics_line(line: str, path: Path, line_number: int) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise MilesConfigError(
            f"{path} line {line_number} is not valid JSON ({error.msg}); every line must be one JSON object "
            f"written by MetricsTracker: remove or repair that line"
        ) from None
    if not isinstance(record, dict) or not isinstance(record.get("rollout_id"), int):
        raise MilesConfigError(
            f"{path} line {line_number} is not a metrics record (a JSON object with an integer 'rollout_id'); "
            f"remove or repair that line"
        )
    return record


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl``, one per rollout id, sorted by rollout id.

    A rollout id logged more than once (a resumed run redoing rollouts after its last checkpoint) is merged in
    file order, so later values win. A final line without its newline is the torn write of a killed run and is
    skipped; any other malformed line is an error. Raises ``MilesConfigError`` when the file is missing or empty.
    """
    path = Path(run_dir) / METRICS_FILENAME
    if not path.is_file():
        raise MilesConfigError(
            f"no {METRICS_FILENAME} in {run_dir}: expected a run folder written by MetricsTracker "
            f"(the drivers' --log-dir); pass that folder"
        )
    lines = path.read_text(encoding="utf-8").split("\n")
    by_rollout: dict[int, dict] = {}
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = _parse_metrics_line(line, path, line_number)
        except MilesConfigError:
            if line_number == len(lines):  # no newline after it: the torn write of a killed run
                continue
            raise
        by_rollout.setdefault(record["rollout_id"], {}).update(record)
    if not by_rollout:
        raise MilesConfigError(
            f"{path} holds no metrics records: the run logged no rollout; run at least one rollout, "
            f"or pass another run folder"
        )
    return [by_rollout[rollout_id] for rollout_id in sorted(by_rollout)]
