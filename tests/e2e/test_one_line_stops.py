"""A stop prints only its own line: every step submitted after the one that failed (the push's export, the load, the
next generation) is awaited, so Ray never reports one of them as an "Unhandled error" when it is dropped."""

import asyncio
import gc
import subprocess
import sys
from pathlib import Path

import pytest
import ray

import train
import train_async
from miles.utils.errors import DivergenceError
from tests.e2e.conftest import SMALL_RUN

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("driver,ranks", [("async", []), ("sync", []),
                                          ("async", ["--actor-num-gpus-per-node", "2", "--micro-batch-size", "4"])],
                         ids=["async", "sync", "async-2-ranks"])
def test_a_diverged_run_leaves_no_unawaited_error(make_args, monkeypatch, driver, ranks):
    """In this process: Ray calls ``_unhandled_error_handler`` for each error object dropped unawaited (with two
    data-parallel ranks too: every rank's step is awaited or released, not only the first's)."""
    reported = []
    monkeypatch.setattr(ray._private.worker, "_unhandled_error_handler", reported.append)
    args = make_args("--lr", "1e10", "--num-rollout", "6", *ranks)
    with pytest.raises(DivergenceError, match="the training diverged"):
        if driver == "async":
            asyncio.run(train_async.train(args))
        else:
            train.train(args)
    gc.collect()
    ray.get(ray.put(None))  # one round trip through the core worker after the run's references were dropped
    assert reported == []


def test_train_async_with_a_huge_lr_exits_1_with_one_line(embedded_cache, tmp_path):
    result = subprocess.run(
        [sys.executable, "train_async.py", *SMALL_RUN, "--num-rollout", "6", "--lr", "1e10",
         "--log-dir", str(tmp_path / "run")],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 1, result.stderr
    assert "Unhandled error" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the training diverged" in errors[0], result.stderr
