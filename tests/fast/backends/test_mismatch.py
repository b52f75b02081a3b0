"""The mismatch metrics of miles/backends/training_utils/loss_hub/mismatch.py against hand-computed values and a plain-Python reference."""

import math
import random

import pytest
import torch

from miles.backends.training_utils.loss_hub.tis import TISChoice
from miles.backends.training_utils.loss_hub.mismatch import mismatch_report

TOL = 1e-6  # float64 sums of a few dozen terms: rounding ~1e-15; a wrong formula is off by O(0.01)


def ref_report(old, roll, masks, choice):
    """Loops and math.exp, following the module docstring."""
    d = [[a - b for a, b, m in zip(o, r, mk) if m] for o, r, mk in zip(old, roll, masks)]
    tokens = [x for row in d for x in row]
    rows = [row for row in d if row]
    out = {
        "kl_k1": sum(-x for x in tokens) / len(tokens),
        "kl_k3": sum(math.exp(x) - 1 - x for x in tokens) / len(tokens),
        "chi2_token": sum(math.exp(2 * x) for x in tokens) / len(tokens) - 1,
        "chi2_sequence": sum(math.exp(max(min(2 * sum(row), 20), -20)) - 1 for row in rows) / len(rows),
        "log_ppl_diff": sum(sum(row) / len(row) for row in rows) / len(rows),
    }
    # the choice used below: clip on [0, 2] per token (keeps everything), geometric rejection on [0.9, 1.1], veto
    dropped_tokens = dropped_sequences = vetoed_tokens = vetoed_sequences = 0
    for row in rows:
        geometric = math.exp(sum(row) / len(row))
        catastrophic = [math.exp(x) < choice.veto_threshold for x in row]
        vetoed_tokens += sum(catastrophic)
        rejected = not (choice.rs_low <= geometric <= choice.rs_high) or any(catastrophic)
        dropped_tokens += len(row) if rejected else 0
        dropped_sequences += rejected
        vetoed_sequences += any(catastrophic)
    out.update(tis_masked_token_fraction=dropped_tokens / len(tokens),
               tis_masked_sequence_fraction=dropped_sequences / len(rows),
               vetoed_token_fraction=vetoed_tokens / len(tokens), vetoed_sequence_fraction=vetoed_sequences / len(rows))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_report_matches_the_plain_python_reference(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 5) for _ in range(8)]
    old = [[rng.gauss(-1, 0.5) for _ in range(n)] for n in lengths]
    roll = [[x + rng.gauss(0, 0.4) for x in row] for row in old]
    masks = [[int(rng.random() > 0.2) for _ in range(n)] for n in lengths]
    masks[0] = [0] * lengths[0]  # a fully masked sequence counts nowhere
    choice = TISChoice(mode="clip", level="token", low=0.0, high=2.0, rs_level="geometric", rs_low=0.9, rs_high=1.1,
                       veto_threshold=0.6)
    as_tensors = lambda rows: [torch.tensor(r, dtype=torch.float64) for r in rows]  # noqa: E731
    report = mismatch_report(as_tensors(old), as_tensors(roll), as_tensors(masks), choice)
    expected = ref_report(old, roll, masks, choice)
    assert report == pytest.approx(expected, abs=TOL)
    assert 0 < expected["tis_masked_sequence_fraction"] < 1 and expected["vetoed_token_fraction"] > 0


def test_hand_computed_values():
    ln2 = math.log(2.0)
    # one sequence, d = (ln 2, 0): w = (2, 1)
    report = mismatch_report([torch.tensor([ln2, 0.0])], [torch.zeros(2)], [torch.ones(2)], None)
    assert report["kl_k1"] == pytest.approx(-ln2 / 2)
    assert report["kl_k3"] == pytest.approx((2 - 1 - ln2) / 2)
    assert report["chi2_token"] == pytest.approx((4 + 1) / 2 - 1)
    assert report["chi2_sequence"] == pytest.approx(4 - 1)  # (Π w)² − 1 = 2² − 1
    assert report["log_ppl_diff"] == pytest.approx(ln2 / 2)
    assert "tis_masked_token_fraction" not in report  # a custom hook: no built-in choice to report


def test_on_policy_is_all_zero_and_extremes_stay_finite():
    same = mismatch_report([torch.zeros(3)], [torch.zeros(3)], [torch.ones(3)], TISChoice(veto_threshold=1e-4))
    assert all(value == 0.0 for value in same.values())
    extreme = mismatch_report([torch.tensor([80.0, -80.0])], [torch.zeros(2)], [torch.ones(2)], TISChoice())
    assert all(math.isfinite(value) for value in extreme.values())
