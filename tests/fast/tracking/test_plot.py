"""miles.tracking.plot: series and groups from metrics.jsonl, PNG files per group, and the CLI's errors."""

import json
import math
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

from miles.tracking.metrics import MetricsTracker
from miles.tracking.plot import (
    MAX_OFF_POLICY_PANELS,
    MIN_OFF_POLICY_PANELS,
    grouped_metrics,
    is_flat,
    main,
    metric_series,
    off_policy_panels,
    plot_bands,
    plot_run,
    spans_decades,
)
from miles.utils.errors import MilesConfigError

REPO_ROOT = Path(__file__).resolve().parents[3]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
GROUPS_IN_PRINTED_ORDER = ["rollout", "eval", "train", "off_policy", "perf", "critic"]  # fixed ones, then others


def _write_run(run_dir: Path, rollouts: int = 12) -> Path:
    """A run folder from the real tracker: five groups, eval every 5 rollouts, one string metric, one NaN."""
    with MetricsTracker(str(run_dir), False, rollouts, 0, {}, "train") as tracker:
        for k in range(rollouts):
            metrics = {
                "rollout/reward_mean": k / rollouts, "rollout/response_len": 2.0 + k % 2,
                "train/pg_loss": math.nan if k == 4 else -0.1 * k, "train/entropy": 1.0, "train/grad_norm": 0.5,
                "train/kl": 0.01 * k, "off_policy/staleness_mean": 1.0, "off_policy/correction": "keep_old_actor",
                "perf/generate_s": 0.01, "critic/value_loss": 0.2,
            }
            if k % 5 == 0:
                metrics["eval/accuracy"] = 0.1 * k
            tracker.log(k, metrics)
    return run_dir


def test_metric_series_keeps_finite_numbers_at_their_rollout_ids():
    # NaN can reach here from a hand-written file (Python's json reads NaN); the tracker itself writes null.
    records = [
        {"rollout_id": 0, "time": 1.0, "a/x": 1.0, "a/s": "tis", "eval/acc": 0.5},
        {"rollout_id": 1, "time": 2.0, "a/x": None, "a/s": "tis", "eval/acc": math.nan, "a/inf_only": math.inf},
        {"rollout_id": 2, "time": 3.0, "a/x": 3, "eval/acc": 0.7, "a/flag": True},
    ]
    assert metric_series(records) == {
        "a/x": ([0, 2], [1.0, 3.0]),
        "eval/acc": ([0, 2], [0.5, 0.7]),
        "a/flag": ([2], [1.0]),
    }


def test_groups_come_in_the_fixed_order_then_alphabetically():
    names = ["zeta/a", "perf/t", "train/l", "loose", "rollout/r", "critic/v", "off_policy/s", "eval/a", "train/m"]
    assert list(grouped_metrics(names).items()) == [  # a list, so the order is compared too
        ("rollout", ["rollout/r"]), ("eval", ["eval/a"]), ("train", ["train/l", "train/m"]),
        ("off_policy", ["off_policy/s"]), ("perf", ["perf/t"]), ("critic", ["critic/v"]), ("other", ["loose"]),
        ("zeta", ["zeta/a"]),
    ]


def test_plot_run_writes_one_png_per_group_with_one_subplot_per_metric(tmp_path):
    run_dir = _write_run(tmp_path / "run")
    written = plot_run(run_dir)
    assert written == [run_dir / "plots" / f"{name}.png" for name in GROUPS_IN_PRINTED_ORDER]
    for path in written:
        assert path.read_bytes()[:8] == PNG_SIGNATURE and path.stat().st_size > 5_000
    # Figure size follows the grid: 4 in x 2.8 in per subplot (+0.5 in for the title), 3 columns, 100 dpi.
    train_height, train_width, _ = matplotlib.image.imread(run_dir / "plots" / "train.png").shape
    eval_height, eval_width, _ = matplotlib.image.imread(run_dir / "plots" / "eval.png").shape
    assert (train_width, train_height) == (1200, 610)  # 4 metrics: 2 rows of 3
    assert (eval_width, eval_height) == (400, 330)  # 1 metric


def test_plot_bands_draws_one_subplot_per_panel_side_by_side(tmp_path):
    curve = ([0.0, 1.0, 2.0], [0.1, 0.2, 0.3], [0.05, 0.1, 0.2], [0.15, 0.3, 0.4])  # x, mean, low, high
    one = plot_bands({"left": {"a": curve, "b": curve}}, tmp_path / "one.png", "title", reference="a")
    two = plot_bands({"left": {"a": curve}, "right": {"a": curve}}, tmp_path / "two.png", "title")
    grid = plot_bands({name: {"a": curve} for name in "abc"}, tmp_path / "grid.png", "title", columns=2)
    one_height, one_width, _ = matplotlib.image.imread(one).shape
    two_height, two_width, _ = matplotlib.image.imread(two).shape
    grid_height, grid_width, _ = matplotlib.image.imread(grid).shape
    assert one_height == two_height
    assert two_width == 2 * one_width  # the figure's width scales with the panels in a row
    assert grid_width == two_width and grid_height > one_height  # three panels, two a row: two rows


def test_plot_run_writes_into_out_dir_when_given(tmp_path):
    run_dir = _write_run(tmp_path / "run", rollouts=3)
    written = plot_run(run_dir, tmp_path / "elsewhere" / "png")
    assert written and all(path.parent == tmp_path / "elsewhere" / "png" for path in written)
    assert not (run_dir / "plots").exists()


def test_plot_run_refuses_a_run_without_numbers(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"rollout_id": 0, "time": 1.0, "off_policy/correction": "tis"}\n')
    with pytest.raises(MilesConfigError, match="no numeric metric to plot"):
        plot_run(tmp_path)


class TestCli:
    def test_prints_each_file_written(self, tmp_path, capsys):
        run_dir = _write_run(tmp_path / "run", rollouts=3)
        assert main([str(run_dir), "--out", str(tmp_path / "out")]) == 0
        expected = [tmp_path / "out" / f"{group}.png" for group in GROUPS_IN_PRINTED_ORDER]
        assert capsys.readouterr().out.splitlines() == [str(path) for path in expected]
        assert all(path.is_file() for path in expected)

    @pytest.mark.parametrize("contents, message", [(None, "no metrics.jsonl in"), ("", "holds no metrics records")])
    def test_missing_or_empty_metrics_is_one_error_line_and_exit_2(self, tmp_path, capsys, contents, message):
        if contents is not None:
            (tmp_path / "metrics.jsonl").write_text(contents)
        with pytest.raises(SystemExit) as exit_info:
            main([str(tmp_path)])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and "Traceback" not in err

    def test_module_entry_point_exits_2_on_a_missing_run(self, tmp_path):
        result = subprocess.run([sys.executable, "-m", "miles.tracking.plot", str(tmp_path / "nope")],
                                capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
        assert result.returncode == 2
        assert result.stderr.startswith("error: no metrics.jsonl in") and result.stdout == ""



# ---------------------------------------------------------------- the off_policy page


def _off_policy_series(names_and_values: dict[str, list[float]]):
    return {f"off_policy/{name}": (list(range(len(values))), values) for name, values in names_and_values.items()}


def test_off_policy_page_shows_the_correction_panels_and_leaves_flat_ones_out():
    rising = [0.1, 0.2, 0.4, 0.3]
    series = _off_policy_series({
        "denominator_behavior_abs_diff_max": [5e-6, 4e-6, 6e-6, 5e-6], "num_snapshots": [1.0, 2.0, 2.0, 2.0],
        "tis_raw_mean": [1.0] * 4, "staleness_max": [0.0, 1.0, 1.0, 1.0], "ess": [1.0, 0.999, 0.998, 0.999],
        "policy_behavior_kl": rising, "kl_k3": rising, "chi2_token": rising, "chi2_sequence": rising,
        "log_ppl_diff": rising, "tis_clip_fraction": [0.0] * 4, "num_tokens": [48.0] * 4, "extra_a": rising,
    })
    keep = off_policy_panels(series, "keep_old_actor")
    assert keep[:2] == ["off_policy/denominator_behavior_abs_diff_max", "off_policy/num_snapshots"]
    assert not {"off_policy/tis_raw_mean", "off_policy/tis_clip_fraction", "off_policy/num_tokens"} & set(keep)
    assert MIN_OFF_POLICY_PANELS <= len(keep) <= MAX_OFF_POLICY_PANELS
    tis = off_policy_panels(series, "tis")
    assert tis[0] == "off_policy/policy_behavior_kl"  # tis_raw_std and the drop fractions are absent here
    assert off_policy_panels(series, "keep_old_actor+tis")[0] == keep[0]  # the label's first word picks the list


def test_flatness_and_log_scale_rules():
    assert is_flat([1.0, 1.0 + 1e-9]) and not is_flat([0.0, 1e-3])
    assert spans_decades([1e-6, 1e-3]) and not spans_decades([0.5, 2.0]) and not spans_decades([0.0, 10.0])
    assert not spans_decades([1e-9] + [0.01 * (1 + k % 5) for k in range(20)])  # one on-policy first rollout


def test_off_policy_png_tops_the_correction_panels_up_to_six(tmp_path):
    records = [{"rollout_id": i, "off_policy/correction": "tis",
                **{f"off_policy/m{k}": float((i + 1) * (k + 1)) for k in range(14)},
                "off_policy/tis_raw_std": 10.0 ** -i} for i in range(5)]
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    plot_run(run)
    height, width, _ = matplotlib.image.imread(run / "plots" / "off_policy.png").shape
    # tis_raw_std (the one "tis" panel present) and 5 others of the 15: 2 rows of 3 (2.8 in each, +0.5 in title)
    assert (width, height) == (1200, 610)
