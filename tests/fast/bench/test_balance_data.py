"""The balance-data bench's own logic on hand-computed steps."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import balance_data  # noqa: E402  (bench/ is a folder of scripts, not a package)


def test_step_load_by_hand():
    lengths = [8, 6, 2, 4]  # contiguous: ranks hold [8, 6] and [2, 4], 14 and 6 tokens, mean 10
    assert balance_data.step_load(lengths, 2, 2, balance=False) == (pytest.approx(1.4), pytest.approx(16 / 14))
    # balanced: [8, 2] and [6, 4], 10 each; micro-batch [8, 2] pads to 16 tokens against 10 real
    assert balance_data.step_load(lengths, 2, 2, balance=True) == (pytest.approx(1.0), pytest.approx(1.6))


def test_draw_lengths_is_seeded_and_in_range():
    lengths = balance_data.draw_lengths(1000, seed=3)
    assert lengths == balance_data.draw_lengths(1000, seed=3)
    assert min(lengths) >= 65 and max(lengths) <= 256 + 4096


def test_measure_balancing_evens_the_load():
    result = balance_data.measure(steps=20, global_batch_size=16, ranks=4, micro_batch_size=2)
    assert result[True][0] < result[False][0]
    assert result[True][0] >= 1.0 and result[False][0] >= 1.0
