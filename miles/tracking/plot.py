"""PNG curves from a run folder: one figure per metric group, one subplot per metric, x = rollout id.

    python -m miles.tracking.plot RUN_DIR [--out DIR]     (also installed as ``miles-plot``)

Groups are the part of a metric name before the first ``/`` (``rollout``, ``eval``, ``train``, ``off_policy``,
``perf``, then any other group in alphabetical order; names without a slash go to ``other``). The ``off_policy``
page shows only the 6-9 panels that carry information for the run's correction (the corrections table's ``panels``; flat
series left out), the rest stays in TensorBoard. A positive series spanning more than two decades gets a log axis;
no axis uses offset notation. Only metrics with at least one finite number are drawn; the line joins the rollouts that hold a value (eval runs every few
rollouts; a NaN was written as null), with a marker on each point when there are few.
``plot_bands`` draws mean curves with a shaded spread, for benchmarks that compare runs over seeds
(``bench/correction_ablation.py``). Figures are drawn on matplotlib's Agg canvas directly, so importing this
module never touches pyplot or the user's backend.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from miles.config import corrections
from miles.tracking.metrics import RESERVED_KEYS, is_number, read_metrics
from miles.utils.cli import run_cli
from miles.utils.errors import MilesConfigError

GROUP_ORDER = ("rollout", "eval", "train", "off_policy", "perf")
UNGROUPED = "other"
SUBPLOT_COLUMNS = 3
SUBPLOT_SIZE_INCHES = (4.0, 2.8)
DEFAULT_PLOT_SUBDIR = "plots"
MAX_POINTS_WITH_MARKERS = 30


def group_of(metric_name: str) -> str:
    """``"train/pg_loss"`` -> ``"train"``; a name without a slash -> ``"other"``."""
    return metric_name.split("/", 1)[0] if "/" in metric_name else UNGROUPED


def metric_series(records: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """Per plottable metric, the (rollout ids, values) of the records that hold a finite number for it.

    Rollouts without a value (eval every few rollouts, a null written for NaN) are left out, so the line joins
    the points that exist; strings are never plotted. Metrics in order of first appearance.
    """
    series: dict[str, tuple[list[int], list[float]]] = {}
    for record in records:
        for name, value in record.items():
            if name not in RESERVED_KEYS and is_number(value) and math.isfinite(value):
                rollout_ids, values = series.setdefault(name, ([], []))
                rollout_ids.append(record["rollout_id"])
                values.append(float(value))
    return series


def grouped_metrics(metric_names: list[str]) -> dict[str, list[str]]:
    """Metric names by group, the groups in ``GROUP_ORDER`` first, then the others alphabetically."""
    groups: dict[str, list[str]] = {}
    for name in metric_names:
        groups.setdefault(group_of(name), []).append(name)
    ordered = [group for group in GROUP_ORDER if group in groups]
    ordered += sorted(group for group in groups if group not in GROUP_ORDER)
    return {group: groups[group] for group in ordered}


# The off_policy page shows the panels that carry information for the run's correction, in the order of its row
# of the corrections table (``miles.config.corrections``: the first MAX_OFF_POLICY_PANELS that are not flat); every
# off_policy metric stays in TensorBoard and metrics.jsonl.
MIN_OFF_POLICY_PANELS, MAX_OFF_POLICY_PANELS = 6, 9
ROUNDING_SCALE = 1e-6  # a top-up series whose values all stay below this is float32 rounding of 0, not a signal
LOG_SCALE_DECADES = 2.0  # a positive series spanning more than this many decades is drawn on a log axis


def is_flat(values: list[float]) -> bool:
    """True when a series carries no information on a plot: all its values equal to within float32 rounding."""
    low, high = min(values), max(values)
    return high - low <= 1e-6 * max(abs(low), abs(high), 1e-30)


def spans_decades(values: list[float]) -> bool:
    """True for an all-positive series whose max over its 10th percentile exceeds 10**LOG_SCALE_DECADES (drawn
    on a log axis). The percentile, not the minimum: one on-policy first rollout (a KL of 1e-9) must not squash
    the rest of the run into one decade at the top of a log axis."""
    ordered = sorted(values)
    return ordered[0] > 0 and math.log10(ordered[-1] / ordered[len(ordered) // 10]) > LOG_SCALE_DECADES


def off_policy_panels(series: dict[str, tuple[list[int], list[float]]], correction: str | None) -> list[str]:
    """The off_policy metrics to draw for ``correction``: its list's non-flat metrics, topped up from the other
    non-flat off_policy metrics above float32 rounding to at least MIN_OFF_POLICY_PANELS, at most
    MAX_OFF_POLICY_PANELS."""
    preferred = [f"off_policy/{name}" for name in corrections.plot_panels(correction)]
    informative = [name for name in series if group_of(name) == "off_policy" and not is_flat(series[name][1])]
    chosen = [name for name in preferred if name in informative]
    top_up = [name for name in informative
              if name not in chosen and max(map(abs, series[name][1])) >= ROUNDING_SCALE
              and not (name == "off_policy/staleness_mean" and "off_policy/staleness_max" in chosen)]  # same curve
    chosen += top_up[: max(MIN_OFF_POLICY_PANELS - len(chosen), 0)]
    return chosen[:MAX_OFF_POLICY_PANELS]


def run_correction(records: list[dict]) -> str | None:
    """The run's correction label, as the actor logged it (``off_policy/correction``), or None."""
    return next((r["off_policy/correction"] for r in records if isinstance(r.get("off_policy/correction"), str)),
                None)


def _draw_group(group: str, series: dict[str, tuple[list[int], list[float]]], path: Path, title: str = "") -> None:
    """One PNG: a grid of subplots, one per metric of the group."""
    columns = min(SUBPLOT_COLUMNS, len(series))
    rows = math.ceil(len(series) / columns)
    width, height = SUBPLOT_SIZE_INCHES
    figure = Figure(figsize=(width * columns, height * rows + 0.5), layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(title or group)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for axis, (name, (rollout_ids, values)) in zip(axes, series.items()):
        marker = "o" if len(values) <= MAX_POINTS_WITH_MARKERS else None  # sparse series: show each point
        axis.plot(rollout_ids, values, marker=marker, markersize=3, linewidth=1.2)
        if spans_decades(values):
            axis.set_yscale("log")
        else:
            axis.ticklabel_format(axis="y", useOffset=False)  # no "+1e-5" offset (a ×1e-6 multiplier may remain)
        axis.set_title(name.split("/", 1)[-1] + (" (log)" if spans_decades(values) else ""), fontsize=10)
        axis.set_xlabel("rollout")
        axis.grid(alpha=0.3)
    for axis in axes[len(series) :]:
        axis.set_visible(False)
    figure.savefig(path, dpi=100)


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write ``<group>.png`` for each metric group of ``run_dir/metrics.jsonl`` into ``out_dir``
    (default ``run_dir/plots``) and return the paths written, in group order.

    Raises ``MilesConfigError`` when metrics.jsonl is missing, empty or has no numeric metric.
    """
    records = read_metrics(run_dir)
    series = metric_series(records)
    if not series:
        raise MilesConfigError(
            f"{Path(run_dir) / 'metrics.jsonl'} has {len(records)} records but no numeric metric to plot; "
            f"log numbers (e.g. rollout/reward_mean) with MetricsTracker.log"
        )
    out_path = Path(out_dir) if out_dir is not None else Path(run_dir) / DEFAULT_PLOT_SUBDIR
    out_path.mkdir(parents=True, exist_ok=True)
    written = []
    for group, names in grouped_metrics(list(series)).items():
        title = group
        if group == "off_policy":
            correction = run_correction(records)
            shown = off_policy_panels(series, correction) or names[:MAX_OFF_POLICY_PANELS]
            title = (f"off_policy (correction: {correction or 'unknown'}; {len(shown)} of {len(names)} metrics, "
                     "the rest flat or in TensorBoard)")
            names = shown
        path = out_path / f"{group}.png"
        _draw_group(group, {name: series[name] for name in names}, path, title)
        written.append(path)
    return written


def plot_bands(panels: dict[str, dict[str, tuple[list[float], list[float], list[float], list[float]]]],
               path: str | Path, title: str, columns: int | None = None, reference: str | None = None,
               dpi: int = 100) -> Path:
    """One PNG of subplots (one per panel, ``columns`` a row, default all in one row; the y-axis shared along a
    row), each with one line per series and its spread shaded.

    ``panels`` maps a subplot title to ``{series label: (x, mean, low, high)}``, e.g. the mean of several seeds'
    curves and their min and max; the series labelled ``reference`` (a baseline) is drawn black and dashed. Used
    by benchmarks that compare runs over seeds.
    """
    columns = columns or len(panels)
    rows = math.ceil(len(panels) / columns)
    width, height = SUBPLOT_SIZE_INCHES
    figure = Figure(figsize=(width * 1.4 * columns, height * 1.3 * rows + 0.5), layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(title, fontsize=10)
    axes = figure.subplots(rows, columns, squeeze=False, sharey="row").ravel()
    for axis, (panel_title, series) in zip(axes, panels.items()):
        for label, (x, mean, low, high) in series.items():
            style = {"color": "black", "linestyle": "--"} if label == reference else {}
            (line,) = axis.plot(x, mean, linewidth=1.2, label=label, **style)
            axis.fill_between(x, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
        axis.set_title(panel_title, fontsize=10)
        axis.set_xlabel("rollout")
        axis.grid(alpha=0.3)
    for axis in axes[len(panels) :]:
        axis.set_visible(False)
    axes[columns - 1].legend(fontsize=7, loc="best")
    figure.savefig(path, dpi=dpi)
    return Path(path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="miles-plot", description="Write PNG curves (one per metric group) from a miles run folder."
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run folder holding metrics.jsonl (the drivers' --log-dir)")
    parser.add_argument("--out", default=None, help="folder for the PNG files (default: RUN_DIR/plots)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """CLI: plot, print each file written; bad input prints ``error: ...`` and exits 2."""
    args = build_parser().parse_args(argv)

    def plot_and_report() -> None:
        for path in plot_run(args.run_dir, args.out):
            print(path)

    run_cli(plot_and_report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
