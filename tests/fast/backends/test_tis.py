"""The TIS family, the veto, OPSM and upstream's TIS hook against hand-computed values and a plain-Python reference.

The reference loops over lists with ``math.exp``; it shares no code with ``tis.py``. Inputs are float64, so 1e-6
is far above the rounding of a sum of a few terms (~1e-15 relative) while any formula error shows up at O(0.01).
"""

import itertools
import math
import random

import pytest
import torch

from miles.backends.training_utils.loss import policy_loss, step_divisor
from miles.backends.training_utils.loss_hub import corrections
from miles.backends.training_utils.loss_hub.math_utils import opsm_keep
from miles.backends.training_utils.loss_hub.tis import TISChoice, tis_weights
from miles.config.corrections import TIS_LEVELS, TIS_MODES
from miles.utils.errors import MilesConfigError
from tests.fast.backends.loss_configs import loss_config

TOL = 1e-6


# ---------------------------------------------------------------- the plain-Python reference


def ref_level_log_ratio(d: list[float], m: list[int], level: str) -> list[float]:
    total = sum(x for x, keep in zip(d, m) if keep)
    if level == "token":
        return list(d)
    if level == "sequence":
        return [total] * len(d)
    return [total / max(sum(m), 1)] * len(d)


def ref_ratio(ell: float) -> float:
    return math.exp(min(max(ell, -20.0), 20.0))


def ref_tis(old, roll, masks, mode, level, low, high, rs_level=None, rs_low=None, rs_high=None, veto=None):
    """Per sequence: (weights, keep) lists, following docs/corrections.md step by step."""
    out = []
    for o, r, m in zip(old, roll, masks):
        d = [a - b for a, b in zip(o, r)]
        ratios = [ref_ratio(x) for x in ref_level_log_ratio(d, m, level)]
        weights, keep = [], []
        for ratio in ratios:
            if mode == "truncate":
                weights.append(min(ratio, high)), keep.append(True)
            elif mode == "clip":
                weights.append(min(max(ratio, low), high)), keep.append(True)
            else:
                inside = low <= ratio <= high
                weights.append(ratio if inside else 0.0), keep.append(inside)
        if rs_level is not None:
            lo = low if rs_low is None else rs_low
            hi = high if rs_high is None else rs_high
            rs_ratios = [ref_ratio(x) for x in ref_level_log_ratio(d, m, rs_level)]
            keep = [k and lo <= x <= hi for k, x in zip(keep, rs_ratios)]
        if veto is not None and any(keep_t and math.exp(x) < veto for x, keep_t in zip(d, m)):
            keep = [False] * len(d)
        keep = [bool(k and mt) for k, mt in zip(keep, m)]
        out.append(([w if k else 0.0 for w, k in zip(weights, keep)], keep))
    return out


def random_batch(seed: int, spread: float = 0.3):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 6) for _ in range(5)]
    old = [[rng.gauss(-1.0, 0.5) for _ in range(n)] for n in lengths]
    roll = [[x + rng.gauss(0.0, spread) for x in row] for row in old]
    masks = [[1 if rng.random() > 0.2 else 0 for _ in range(n)] for n in lengths]
    # two fixed sequences whose ratios cross every bound used here, at every level
    old, roll, masks = old + [[0.7, -0.7], [1.0, 1.0]], roll + [[0.0, 0.0], [0.0, 0.0]], masks + [[1, 1], [1, 1]]
    return lengths + [2, 2], old, roll, masks


def padded(rows: list[list[float]], width: int) -> torch.Tensor:
    return torch.tensor([row + [0.0] * (width - len(row)) for row in rows], dtype=torch.float64)


def run_tis(old, roll, masks, choice: TISChoice):
    width = max(map(len, old))
    mask = padded([[float(x) for x in m] for m in masks], width) != 0
    return tis_weights(padded(old, width) - padded(roll, width), mask, choice)


def assert_matches(result, expected, lengths):
    for i, (weights, keep) in enumerate(expected):
        n = lengths[i]
        assert result.weights[i, :n].tolist() == pytest.approx(weights, abs=TOL, rel=TOL)
        assert result.keep[i, :n].tolist() == keep


# ---------------------------------------------------------------- every mode x level, rejection, veto


@pytest.mark.parametrize("mode, level", list(itertools.product(TIS_MODES, TIS_LEVELS)))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_mode_and_level_matches_the_reference(mode, level, seed):
    lengths, old, roll, masks = random_batch(seed)
    low, high = (0.8, 1.25) if level != "sequence" else (0.5, 2.0)
    if mode == "truncate":
        low = 0.0
    result = run_tis(old, roll, masks, TISChoice(mode=mode, level=level, low=low, high=high))
    expected = ref_tis(old, roll, masks, mode, level, low, high)
    assert_matches(result, expected, lengths)
    # the case must exercise the bound: some weight differs from its ratio (else the test proves little)
    assert any(w != pytest.approx(r) for w, r in zip(result.weights[result.keep].tolist(),
                                                     result.ratio[result.keep].tolist())) or mode == "mask"


@pytest.mark.parametrize("rs_level", TIS_LEVELS)
@pytest.mark.parametrize("seed", [3, 4])
def test_rejection_and_veto_match_the_reference(rs_level, seed):
    lengths, old, roll, masks = random_batch(seed, spread=0.6)
    choice = TISChoice(mode="clip", level="token", low=0.0, high=2.0, rs_level=rs_level, rs_low=0.9, rs_high=1.1,
                       veto_threshold=0.5)
    result = run_tis(old, roll, masks, choice)
    assert_matches(result, ref_tis(old, roll, masks, "clip", "token", 0.0, 2.0, rs_level, 0.9, 1.1, 0.5), lengths)


def test_hand_computed_levels_modes_and_veto():
    ln = math.log
    # one sequence, token ratios 2, 0.5, 4 (log ratios ln2, −ln2, ln4), the last token masked out
    old, roll, masks = [[ln(2.0), -ln(2.0), ln(4.0)]], [[0.0, 0.0, 0.0]], [[1, 1, 0]]
    token = run_tis(old, roll, masks, TISChoice(mode="clip", level="token", low=0.6, high=1.5))
    assert token.weights[0, :2].tolist() == pytest.approx([1.5, 0.6])
    sequence = run_tis(old, roll, masks, TISChoice(mode="truncate", level="sequence", high=2.0))
    assert sequence.ratio[0, :2].tolist() == pytest.approx([1.0, 1.0])  # exp(ln2 − ln2): the masked ln4 is out
    geometric = run_tis([[ln(4.0), 0.0]], [[0.0, 0.0]], [[1, 1]], TISChoice(mode="mask", level="geometric",
                                                                            low=0.99, high=1.01))
    assert geometric.ratio[0].tolist() == pytest.approx([2.0, 2.0])  # sqrt(4 · 1)
    assert geometric.keep[0].tolist() == [False, False]  # SkyRL's band drops the whole sequence
    icepop = run_tis(old, roll, masks, TISChoice(mode="mask", level="token", low=0.5, high=1.5))
    assert icepop.keep[0].tolist() == [False, True, False] and icepop.weights[0, :2].tolist() == [0.0, 0.5]
    vetoed = run_tis(old, roll, masks, TISChoice(veto_threshold=0.6))  # 0.5 < 0.6: the sequence goes
    assert vetoed.keep[0].tolist() == [False, False, False]
    kept = run_tis(old, roll, masks, TISChoice(veto_threshold=0.4))
    assert kept.keep[0].tolist() == [True, True, False]
    at_threshold = run_tis(old, roll, masks, TISChoice(veto_threshold=0.5))  # "below" is strict: 0.5 stays
    assert at_threshold.keep[0].tolist() == [True, True, False]
    truncated = run_tis([[ln(0.25), ln(3.0)]], [[0.0, 0.0]], [[1, 1]], TISChoice(mode="truncate", low=0.5, high=2.0))
    assert truncated.weights[0].tolist() == pytest.approx([0.25, 2.0])  # truncation has no lower side


def test_clip_at_and_beyond_both_bounds_and_exactly_one_on_policy():
    raw = [0.25, 0.5, 1.0, 2.0, 4.0]
    result = run_tis([[math.log(x) for x in raw]], [[0.0] * 5], [[1] * 5], TISChoice(mode="clip", low=0.5, high=2.0))
    assert result.ratio[0].tolist() == pytest.approx(raw)
    assert result.weights[0].tolist() == [0.5, 0.5, 1.0, 2.0, 2.0]  # exactly the bounds at and beyond them
    log_probs = torch.randn(4, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 3
    on_policy = tis_weights(log_probs - log_probs.clone(), torch.ones(4, 6, dtype=torch.bool), TISChoice())
    assert torch.equal(on_policy.weights, torch.ones_like(on_policy.weights)) and not on_policy.weights.requires_grad


# ---------------------------------------------------------------- OPSM


def ref_opsm(den, lp, adv, masks, delta):
    out = []
    for d, p, a, m in zip(den, lp, adv, masks):
        kappa = sum(x - y for x, y, k in zip(d, p, m) if k) / max(sum(m), 1)
        out.append([not (a_t < 0 and kappa > delta) for a_t in a])
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_opsm_matches_the_reference(seed):
    lengths, den, lp, masks = random_batch(seed, spread=0.05)
    rng = random.Random(seed + 9)
    adv = [[rng.choice([-1.0, 0.5]) * (1 + 0.1 * t) for t in range(n)] for n in lengths]
    width = max(lengths)
    mask = padded([[float(x) for x in m] for m in masks], width) != 0
    keep = opsm_keep(padded(den, width), padded(lp, width), padded(adv, width), mask, 0.01)
    expected = ref_opsm(den, lp, adv, masks, 0.01)
    assert [keep[i, :n].tolist() for i, n in enumerate(lengths)] == expected
    assert any(not k for row in expected for k in row) and any(k for row in expected for k in row)


def test_opsm_hand_computed():
    # κ = mean(old − lp) = (0.3 + 0.1)/2 = 0.2 > 0.1: the negative-advantage tokens go, the positive one stays
    keep = opsm_keep(torch.tensor([[0.3, 0.1]]), torch.zeros(1, 2), torch.tensor([[-1.0, 2.0]]),
                     torch.ones(1, 2, dtype=torch.bool), 0.1)
    assert keep.tolist() == [[False, True]]
    same = opsm_keep(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[-1.0, -1.0]]),
                     torch.ones(1, 2, dtype=torch.bool), 1e-4)
    assert same.tolist() == [[True, True]]  # denominator = current actor: κ = 0, nothing is ever masked


# ---------------------------------------------------------------- upstream's hook


def hook_inputs(seed: int):
    lengths, old, roll, masks = random_batch(seed, spread=0.5)
    to_tensors = lambda rows: [torch.tensor(row, dtype=torch.float64) for row in rows]  # noqa: E731
    pg = torch.tensor([random.Random(seed).gauss(0, 1) for _ in range(sum(lengths))], dtype=torch.float64)
    return old, roll, masks, dict(pg_loss=pg, train_log_probs=to_tensors(old), rollout_log_probs=to_tensors(roll),
                                  loss_masks=[torch.tensor(m, dtype=torch.float64) for m in masks])


@pytest.mark.parametrize("name", ["vanilla_tis_function", "icepop_function"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_upstream_builtins_equal_upstream_formulas(name, seed):
    old, roll, masks, kwargs = hook_inputs(seed)
    args = loss_config("--use-tis", "--tis-clip", "1.3", "--tis-clip-low", "0.7").hook_args
    function = corrections.load_weight_function(f"miles.backends.training_utils.loss_hub.corrections.{name}")
    pg, out_masks, metrics = function(args, **kwargs)
    ratios = [math.exp(a - b) for o, r in zip(old, roll) for a, b in zip(o, r)]
    if name == "vanilla_tis_function":  # upstream: clamp(exp(train − rollout), tis_clip_low, tis_clip)
        weights = [min(max(x, 0.7), 1.3) for x in ratios]
    else:  # upstream: the ratio where tis_clip_low <= r <= tis_clip, else 0
        weights = [x if 0.7 <= x <= 1.3 else 0.0 for x in ratios]
    assert pg.tolist() == pytest.approx([p * w for p, w in zip(kwargs["pg_loss"].tolist(), weights)], abs=TOL)
    assert [m.tolist() for m in out_masks] == [[float(x) for x in m] for m in masks]  # passed through
    assert metrics["tis"].tolist() == pytest.approx(ratios, rel=TOL)
    assert metrics["tis_clipfrac"].tolist() == [float(w != x) for w, x in zip(weights, ratios)]


def test_a_user_function_loaded_by_path_is_the_loss_entry_point(importable_module):
    importable_module(
        "my_tis",
        "def half(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs):\n"
        "    masks = [m.clone() for m in loss_masks]\n"
        "    masks[0][0] = 0\n"
        "    return pg_loss * 0.5, masks, {'seen_tis_clip': pg_loss * 0 + args.tis_clip}\n",
    )
    batch = {
        "loss_masks": [torch.tensor([1.0, 1.0]), torch.tensor([1.0])],
        "advantages": [torch.tensor([1.0, 1.0]), torch.tensor([-1.0])],
        "old_log_probs": [torch.zeros(2), torch.zeros(1)],
        "rollout_log_probs": [torch.zeros(2), torch.zeros(1)],
    }
    log_probs = [torch.zeros(2, requires_grad=True), torch.zeros(1, requires_grad=True)]
    cfg = loss_config("--use-tis", "--custom-tis-function-path", "my_tis.half", "--tis-clip", "3.0")
    loss, metrics = policy_loss(cfg, batch, log_probs, None, step_divisor=2.0)
    # ratio 1 everywhere: pg = −A; halved; sample 0 keeps only its second token: (−0.5 + 0.5) / 2
    assert loss.item() == pytest.approx((-0.5 + 0.5) / 2)
    assert metrics["seen_tis_clip"] == 3.0
    loss.backward()
    assert log_probs[0].grad.tolist() == pytest.approx([0.0, -0.25])  # the masked token gets no gradient


@pytest.mark.parametrize("path, needle", [
    ("nowhere.at_all", "cannot be imported"),
    ("miles.backends.training_utils.loss_hub.corrections.no_such_function", "has no function 'no_such_function'"),
    ("justaname", "must name a module and a function"),
])
def test_a_bad_path_names_the_value_the_rule_and_the_fix(path, needle):
    with pytest.raises(MilesConfigError, match=needle) as info:
        corrections.load_weight_function(path)
    assert repr(path) in str(info.value) and "icepop_function" in str(info.value)


@pytest.mark.parametrize("mode, level", list(itertools.product(TIS_MODES, TIS_LEVELS)))
def test_policy_loss_with_each_builtin_choice_matches_the_reference(mode, level):
    lengths, old, roll, masks = random_batch(7, spread=0.4)
    rng = random.Random(8)
    lp = [[x + rng.gauss(0, 0.1) for x in row] for row in old]
    adv = [[rng.gauss(0, 1)] * n for n in lengths]
    low = 0.0 if mode == "truncate" else 0.8
    cfg = loss_config("--use-tis", "--tis-mode", mode, "--tis-level", level, "--tis-clip-low", str(low),
                      "--tis-clip", "1.25")
    as_tensors = lambda rows: [torch.tensor(r, dtype=torch.float64) for r in rows]  # noqa: E731
    batch = {"loss_masks": as_tensors(masks), "advantages": as_tensors(adv), "old_log_probs": as_tensors(old),
             "rollout_log_probs": as_tensors(roll)}
    loss, _ = policy_loss(cfg, batch, as_tensors(lp), None, step_divisor(batch["loss_masks"], False))
    expected_total = 0.0
    for (weights, keep), o, p, a in zip(ref_tis(old, roll, masks, mode, level, low, 1.25), old, lp, adv):
        terms = []
        for w, k, o_t, p_t, a_t in zip(weights, keep, o, p, a):
            if k:
                ratio = math.exp(p_t - o_t)
                terms.append(w * max(-ratio * a_t, -min(max(ratio, 0.8), 1.2) * a_t))
        expected_total += sum(terms) / len(terms) if terms else 0.0
    assert loss.item() == pytest.approx(expected_total / len(lengths), abs=TOL)
