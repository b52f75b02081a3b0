"""The runtime guard's launch-time rules: --max-weight-staleness, the guard flags' ranges, the GRPO warning.

Arguments come from the real parser (``parse_args(argv=[...])``); the drivers and miles-check run as subprocesses
from the repository root, as a user would start them.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from miles.utils.arguments import async_staleness_warning, check_async_max_weight_staleness, parse_args
from miles.utils.errors import MilesConfigError

REPO_ROOT = Path(__file__).resolve().parents[3]
HEAVY_MODULES = ("torch", "ray", "transformers")
CORRECTION_FLAGS = ["--use-rollout-logprobs", "--use-tis", "--keep-old-actor"]
CRITIC_FREE_ESTIMATORS = [
    ["--advantage-estimator", "grpo"],
    ["--advantage-estimator", "gspo"],
    ["--advantage-estimator", "reinforce_plus_plus", "--normalize-advantages"],
    ["--advantage-estimator", "reinforce_plus_plus_baseline", "--normalize-advantages"],
]


def _staleness_args(max_weight_staleness: int, update_weights_interval: int, *extra: str):
    return parse_args(argv=["--max-weight-staleness", str(max_weight_staleness),
                            "--update-weights-interval", str(update_weights_interval), *extra])


def _staleness_error(max_weight_staleness: int, update_weights_interval: int) -> str:
    args = _staleness_args(max_weight_staleness, update_weights_interval)
    with pytest.raises(MilesConfigError) as caught:
        check_async_max_weight_staleness(args)
    return str(caught.value)


def _run(*command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, *command], check=False, cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60, env=env)


# ---------------------------------------------------------------- --max-weight-staleness K at startup


@pytest.mark.parametrize("max_weight_staleness, update_weights_interval", [(1, 2), (1, 3), (2, 3), (3, 7)])
def test_async_interval_above_the_bound_is_rejected_with_value_rule_and_fix(max_weight_staleness,
                                                                           update_weights_interval):
    message = _staleness_error(max_weight_staleness, update_weights_interval)
    assert f"--max-weight-staleness {max_weight_staleness} cannot hold" in message  # the value
    assert f"--update-weights-interval {update_weights_interval} trains on data up to " \
           f"{update_weights_interval} rollouts stale" in message  # the rule: the loop's worst case is N
    assert f"Pass --update-weights-interval {max_weight_staleness} or less" in message  # the fix
    assert "train.py" not in message  # an async fix exists, so the sync driver is not the advice


@pytest.mark.parametrize("max_weight_staleness, update_weights_interval", [(1, 1), (2, 1), (2, 2), (3, 3), (5, 2)])
def test_async_interval_within_the_bound_is_accepted(max_weight_staleness, update_weights_interval):
    check_async_max_weight_staleness(_staleness_args(max_weight_staleness, update_weights_interval))


def test_the_bound_is_off_by_default():
    args = parse_args(argv=["--update-weights-interval", "50"])
    assert args.max_weight_staleness is None
    check_async_max_weight_staleness(args)


@pytest.mark.parametrize("update_weights_interval", [1, 2])
def test_zero_staleness_suggests_the_synchronous_driver(update_weights_interval):
    message = _staleness_error(0, update_weights_interval)
    assert "--max-weight-staleness 0 cannot hold" in message
    assert "train synchronously with train.py" in message.lower()
    assert "--update-weights-interval 1 or less" not in message  # K = 0 rejects interval 1 too


@pytest.mark.parametrize(
    "max_weight_staleness, update_weights_interval, offered",
    [
        (1, 2, 1),
        (2, 5, 2),
        (0, 2, None),  # no async interval holds K = 0: the advice is the sync driver
    ],
)
def test_every_interval_the_message_suggests_is_accepted(max_weight_staleness, update_weights_interval, offered):
    """Following the advice must work: each interval the fix offers passes the same check, and the next one does
    not (the offer is the largest that works)."""
    message = _staleness_error(max_weight_staleness, update_weights_interval)
    suggested = re.search(r"Pass --update-weights-interval (\d+) or less", message)
    assert (None if suggested is None else int(suggested.group(1))) == offered, message
    if offered is None:
        assert "train synchronously with train.py" in message.lower()
        _staleness_error(max_weight_staleness, 1)  # not even interval 1 holds it
        return
    for interval in range(1, offered + 1):
        check_async_max_weight_staleness(_staleness_args(max_weight_staleness, interval))
    _staleness_error(max_weight_staleness, offered + 1)


# ---------------------------------------------------------------- the guard flags' ranges (flag_rules.FLAG_RULES)


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["--keep-old-actor-tol", "0"], ["--keep-old-actor-tol is 0.0", "must be > 0", "Pass e.g. --keep-old-actor-tol 1e-4"]),
        (["--keep-old-actor-tol=-1e-4"], ["--keep-old-actor-tol is -0.0001", "must be > 0"]),
        (["--keep-old-actor-tol", "nan"], ["--keep-old-actor-tol is nan", "must be > 0"]),
        (["--max-weight-staleness=-1"], ["--max-weight-staleness is -1", "must be >= 0"]),
        (["--max-behavior-kl", "0"], ["--max-behavior-kl is 0.0", "must be > 0"]),
        (["--max-behavior-kl=-0.5"], ["--max-behavior-kl is -0.5", "must be > 0"]),
        (["--max-behavior-kl", "nan"], ["--max-behavior-kl is nan", "must be > 0"]),
    ],
)
def test_guard_settings_out_of_range_are_rejected(argv, fragments):
    with pytest.raises(MilesConfigError) as caught:
        parse_args(argv=argv)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_guard_settings_at_their_edges_are_accepted():
    args = parse_args(
        argv=["--keep-old-actor-tol", "1e-12", "--max-weight-staleness", "0", "--max-behavior-kl", "1e-9"]
    )
    assert (args.keep_old_actor_tol, args.max_weight_staleness, args.max_behavior_kl) == (1e-12, 0, 1e-9)
    defaults = parse_args(argv=[])
    assert (defaults.keep_old_actor_tol, defaults.max_weight_staleness, defaults.max_behavior_kl) == (1e-4, None, None)


# ---------------------------------------------------------------- the startup warning for uncorrected critic-free runs


@pytest.mark.parametrize("correction", [[], *([flag] for flag in CORRECTION_FLAGS)], ids=["none", *CORRECTION_FLAGS])
def test_no_warning_for_ppo(correction):
    assert async_staleness_warning(parse_args(argv=["--advantage-estimator", "ppo", *correction])) is None


@pytest.mark.parametrize("estimator", CRITIC_FREE_ESTIMATORS, ids=lambda argv: argv[1])
@pytest.mark.parametrize("correction", CORRECTION_FLAGS)
def test_no_warning_for_a_corrected_critic_free_run(estimator, correction):
    assert async_staleness_warning(parse_args(argv=[*estimator, correction])) is None


@pytest.mark.parametrize("estimator", CRITIC_FREE_ESTIMATORS, ids=lambda argv: argv[1])
def test_uncorrected_critic_free_run_is_warned_once_with_the_flag_that_corrects_it(estimator):
    warning = async_staleness_warning(parse_args(argv=estimator))
    assert warning is not None
    assert f"async {estimator[1]} runs without a behavior-policy correction" in warning
    assert "add --use-tis" in warning and "off_policy/" in warning


# ---------------------------------------------------------------- the CLI: train_async.py and miles-check


def test_train_async_rejects_an_unreachable_staleness_bound_cleanly_before_heavy_imports():
    result = _run("-X", "importtime", "train_async.py", "--max-weight-staleness", "1", "--update-weights-interval", "2")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert errors == [_staleness_error(1, 2).join(["error: ", ""])]  # exactly one clean line, no traceback
    imported = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert not {module for module in imported if module.split(".")[0] in HEAVY_MODULES}


def test_miles_check_reports_the_unreachable_bound_and_exits_1_with_strict():
    # by default only the correction contract counts: the bound is printed as a note, exit 0
    result = _run("-m", "miles.check", "--", "--max-weight-staleness", "1", "--update-weights-interval", "2")
    assert result.returncode == 0 and "--max-weight-staleness 1 cannot hold" in result.stdout, result.stdout
    result = _run("-m", "miles.check", "--strict", "--", "--max-weight-staleness", "1", "--update-weights-interval",
                  "2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "command line: train_async.py: REJECTED" in result.stdout
    assert "--max-weight-staleness 1 cannot hold" in result.stdout
    assert "fix: pass --update-weights-interval 1 or less." in result.stdout
    assert "Traceback" not in result.stderr


def test_miles_check_accepts_the_bound_within_the_interval():
    result = _run("-m", "miles.check", "--", "--max-weight-staleness", "2", "--update-weights-interval", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "command line: train_async.py: OK" in result.stdout
