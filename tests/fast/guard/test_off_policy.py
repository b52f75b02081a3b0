"""The runtime guard's pure functions (miles/guard/off_policy.py) against simulations and hand-computed values.

The async loop is simulated here from its order alone (docs/design.md §2, train_async.py), never from the formula:
push the weights after ``start`` rollouts as version 1; start generating rollout ``start``; then for each k, start
generating k+1, train on k, and when (k+1) % N == 0 drain the in-flight generation and push the trained weights.
A rollout's behavior weights are the ones most recently pushed when its generation started. ``pytest -s`` prints
the upstream two-slot queue's uncorrected rollouts, so that test doubles as documentation.
"""

import math
from types import SimpleNamespace
from collections import deque
from dataclasses import dataclass, field

import pytest
import torch

from miles.backends.training_utils.loss_hub.math_utils import compute_ess_ratio
from miles.backends.training_utils.snapshots import WeightSnapshotStore
from miles.guard.off_policy import (
    BehaviorDriftError,
    check_behavior_kl,
    check_denominator_tolerance,
    check_engine_loaded_pushed_weights,
    check_one_version_per_sample,
    check_rollout_log_probs,
    check_snapshot_count,
    check_snapshot_provenance,
    check_staleness,
    expected_staleness,
    sample_staleness,
)
from miles.backends.training_utils.loss_hub.mismatch import denominator_vs_behavior, policy_vs_behavior
from miles.config.corrections import in_effect
from miles.utils.arguments import parse_args
from miles.utils.errors import MilesConfigError, OffPolicyGuardError

NAN, INF = float("nan"), float("inf")
BUG_NOTICE = "This is a bug in miles"
NUM_SIMULATED_ROLLOUTS = 30


# ---------------------------------------------------------------- the loops, simulated from their order


@dataclass
class LoopTrace:
    """What a simulated loop did: per rollout id, who generated it and what the trainer had trained by then."""

    behavior_version: dict[int, int] = field(default_factory=dict)  # rollout -> version stamped at generation start
    behavior_rollouts_trained: dict[int, int] = field(default_factory=dict)  # rollout -> j of W_j that generated it
    trained_at_training: dict[int, int] = field(default_factory=dict)  # rollout -> rollouts trained before its step
    version_to_rollouts_trained: dict[int, int] = field(default_factory=dict)  # the trainer's push table
    events: list[tuple] = field(default_factory=list)  # ("push", version, j) and ("train", rollout, version), in order

    def staleness(self, rollout_id: int) -> int:
        return self.trained_at_training[rollout_id] - self.behavior_rollouts_trained[rollout_id]


class _Loop:
    """The trainer's weight counter, its pushes, and the engine's generations, as events of a LoopTrace."""

    def __init__(self, start_rollout_id: int) -> None:
        self.trace = LoopTrace()
        self.rollouts_trained = start_rollout_id  # W_start: fresh (0) or loaded from a checkpoint
        self.latest_push: tuple[int, int] | None = None  # (version, j)

    def push(self) -> None:
        version = len(self.trace.version_to_rollouts_trained) + 1
        self.latest_push = (version, self.rollouts_trained)
        self.trace.version_to_rollouts_trained[version] = self.rollouts_trained
        self.trace.events.append(("push", version, self.rollouts_trained))

    def start_generation(self, rollout_id: int) -> None:
        version, rollouts_trained = self.latest_push
        self.trace.behavior_version[rollout_id] = version
        self.trace.behavior_rollouts_trained[rollout_id] = rollouts_trained

    def train(self, rollout_id: int) -> None:
        self.trace.trained_at_training[rollout_id] = self.rollouts_trained
        self.trace.events.append(("train", rollout_id, self.trace.behavior_version[rollout_id]))
        self.rollouts_trained += 1


def simulate_async_loop(interval: int, start_rollout_id: int, num_rollouts: int) -> LoopTrace:
    loop = _Loop(start_rollout_id)
    end = start_rollout_id + num_rollouts
    loop.push()  # before the loop: the weights after `start` rollouts
    loop.start_generation(start_rollout_id)
    for rollout_id in range(start_rollout_id, end):
        if rollout_id + 1 < end:
            loop.start_generation(rollout_id + 1)  # before training on rollout_id: the overlap
        loop.train(rollout_id)
        if (rollout_id + 1) % interval == 0:
            # Drain: the in-flight generation finishes with the version it started with; only then push.
            loop.push()
    return loop.trace


def simulate_sync_loop(start_rollout_id: int, num_rollouts: int) -> LoopTrace:
    loop = _Loop(start_rollout_id)
    loop.push()
    for rollout_id in range(start_rollout_id, start_rollout_id + num_rollouts):
        loop.start_generation(rollout_id)
        loop.train(rollout_id)
        loop.push()
    return loop.trace


# ---------------------------------------------------------------- expected_staleness


@pytest.mark.parametrize("start_rollout_id", [0, 1, 5, 7])
@pytest.mark.parametrize("interval", [1, 2, 3])
def test_expected_staleness_matches_the_simulated_async_loop(interval, start_rollout_id):
    trace = simulate_async_loop(interval, start_rollout_id, NUM_SIMULATED_ROLLOUTS)
    rollout_ids = range(start_rollout_id, start_rollout_id + NUM_SIMULATED_ROLLOUTS)
    simulated = [trace.staleness(k) for k in rollout_ids]
    computed = [expected_staleness(k, interval, start_rollout_id) for k in rollout_ids]
    assert computed == simulated
    assert simulated[0] == 0 and max(simulated) == interval  # the first rollout is fresh; the worst case is N


@pytest.mark.parametrize("start_rollout_id", [0, 5])
@pytest.mark.parametrize("interval", [1, 3])
def test_sample_staleness_from_the_push_table_agrees_with_the_loop(interval, start_rollout_id):
    """The trainer's version -> j table, as the loop builds it, gives each sample the simulated staleness."""
    trace = simulate_async_loop(interval, start_rollout_id, NUM_SIMULATED_ROLLOUTS)
    for k in range(start_rollout_id, start_rollout_id + NUM_SIMULATED_ROLLOUTS):
        staleness = sample_staleness(k, [trace.behavior_version[k]] * 3, trace.version_to_rollouts_trained)
        assert staleness == [trace.staleness(k)] * 3
        check_staleness(k, staleness, expected_staleness(k, interval, start_rollout_id), max_weight_staleness=interval)


@pytest.mark.parametrize("start_rollout_id", [0, 1, 7])
def test_the_sync_loop_is_never_stale(start_rollout_id):
    trace = simulate_sync_loop(start_rollout_id, NUM_SIMULATED_ROLLOUTS)
    rollout_ids = range(start_rollout_id, start_rollout_id + NUM_SIMULATED_ROLLOUTS)
    assert [trace.staleness(k) for k in rollout_ids] == [0] * NUM_SIMULATED_ROLLOUTS
    for k in rollout_ids:  # what train.py asks the guard to hold: expected staleness 0, even at K = 0
        staleness = sample_staleness(k, [trace.behavior_version[k]], trace.version_to_rollouts_trained)
        check_staleness(k, staleness, expected=0, max_weight_staleness=0)


def test_expected_staleness_refuses_a_rollout_before_the_run_start():
    with pytest.raises(ValueError, match="rollout 3 comes before the run's first rollout 5"):
        expected_staleness(3, 2, start_rollout_id=5)


# ---------------------------------------------------------------- upstream's two-slot queue vs the version-keyed store


def upstream_two_slot_uncorrected(trace: LoopTrace, rollout_ids: range) -> list[int]:
    """Upstream keeps W after each train step in a 2-slot queue; rollout k's denominator is the older slot W_{k−1}."""
    queue = deque([rollout_ids.start], maxlen=2)  # at init the old actor is a copy of the actor, W_start
    uncorrected = []
    for k in rollout_ids:
        denominator_rollouts_trained = queue[0]
        if denominator_rollouts_trained != trace.behavior_rollouts_trained[k]:
            uncorrected.append(k)
        queue.append(trace.trained_at_training[k] + 1)  # the train step: W_k -> W_{k+1}
    return uncorrected


def replay_through_snapshot_store(trace: LoopTrace) -> tuple[list[int], int]:
    """Drive a real WeightSnapshotStore with the trace's pushes and trainings.

    The "weights" are one scalar equal to j, so a served snapshot says which W_j it is. Returns the rollouts whose
    served weights are not their behavior weights, and the most snapshots ever held.
    """
    store, uncorrected, most_held = WeightSnapshotStore(), [], 0
    for kind, first, second in trace.events:
        if kind == "push":
            version, rollouts_trained = first, second
            weights = {"w": torch.tensor([float(rollouts_trained)])}
            store.add_pushed(version, weights, digests={})
        else:
            rollout_id, version = first, second
            snapshot = store.take_for_training(version, rollout_id)
            if float(snapshot.state_dict["w"]) != trace.behavior_rollouts_trained[rollout_id]:
                uncorrected.append(rollout_id)
        most_held = max(most_held, len(store))
    return uncorrected, most_held


def test_upstream_two_slot_queue_leaves_rollouts_uncorrected_where_the_snapshot_store_does_not():
    num_rollouts = 12
    rollout_ids = range(num_rollouts)
    # Under upstream's queue the denominator of rollout k ≥ 1 is W_{k−1}, exact only where d(k) = 1, with
    # d(k) = ((k − 1) mod N) + 1 (docs/design.md §2), written out here rather than taken from expected_staleness.
    expected_uncorrected = {
        1: [],
        2: [k for k in range(2, num_rollouts) if k % 2 == 0],
        3: [k for k in range(1, num_rollouts) if ((k - 1) % 3) + 1 != 1],
    }
    assert expected_uncorrected[3] == [2, 3, 5, 6, 8, 9, 11]
    for interval in (1, 2, 3):
        trace = simulate_async_loop(interval, 0, num_rollouts)
        upstream = upstream_two_slot_uncorrected(trace, rollout_ids)
        miles, most_held = replay_through_snapshot_store(trace)
        print(f"\n--update-weights-interval {interval}, rollouts 0..{num_rollouts - 1}: upstream's two-slot queue "
              f"leaves {upstream or 'none'} uncorrected; miles' version-keyed store leaves {miles or 'none'} "
              f"(at most {most_held} snapshots held)")
        assert upstream == expected_uncorrected[interval]
        assert miles == []
        assert most_held <= 2


# ---------------------------------------------------------------- the check_* functions


def _guard_message(check, *args, error=OffPolicyGuardError, **kwargs) -> str:
    with pytest.raises(error) as caught:
        check(*args, **kwargs)
    return str(caught.value)


def test_check_one_version_per_sample():
    assert check_one_version_per_sample(4, [[2, 2, 2], [2], [3, 3]]) == [2, 2, 3]
    message = _guard_message(check_one_version_per_sample, 4, [[2, 2], [2, 3, 3]])
    assert "rollout 4: sample 1" in message and "[2, 3, 3]" in message and BUG_NOTICE in message
    # A sample without any version cannot name its behavior policy either.
    assert "sample 0" in _guard_message(check_one_version_per_sample, 4, [[], [2]])


def test_sample_staleness_and_an_unknown_version():
    table = {1: 0, 2: 2, 3: 4}
    assert sample_staleness(5, [2, 3, 3], table) == [3, 1, 1]
    message = _guard_message(sample_staleness, 5, [3, 9, 7, 9], table)
    assert "rollout 5" in message and "[7, 9]" in message and "pushed: [1, 2, 3]" in message
    assert BUG_NOTICE in message


def test_check_staleness():
    check_staleness(6, [2, 2], expected=2, max_weight_staleness=None)
    check_staleness(6, [2, 2], expected=2, max_weight_staleness=2)  # the bound is inclusive
    wrong = _guard_message(check_staleness, 6, [2, 1, 3, 1], expected=2, max_weight_staleness=None)
    assert "rollout 6" in wrong and "[1, 3]" in wrong and "implies 2" in wrong and BUG_NOTICE in wrong
    bound = _guard_message(check_staleness, 6, [2, 2], expected=2, max_weight_staleness=1)
    assert "rollout 6 is 2 rollout(s) stale" in bound and "--max-weight-staleness 1" in bound
    assert "Lower --update-weights-interval to at most 1" in bound and BUG_NOTICE not in bound


FP_A, FP_B, FP_C = "a" * 64, "b" * 64, "c" * 64  # fingerprints are 64 hex digits; messages show the first 12


def test_check_engine_loaded_pushed_weights():
    pushed = {1: FP_A, 2: FP_B}
    check_engine_loaded_pushed_weights(8, [1, 2, 2], [FP_A, FP_B, FP_B], pushed)
    message = _guard_message(check_engine_loaded_pushed_weights, 8, [1, 2], [FP_A, FP_C], pushed)
    assert "rollout 8, sample 1" in message and "version 2" in message
    assert "c" * 12 in message and "b" * 12 in message and BUG_NOTICE in message
    # An engine that loaded nothing stamps no fingerprint: that is a mismatch too.
    assert "fingerprint none" in _guard_message(check_engine_loaded_pushed_weights, 8, [1], [None], pushed)


def test_check_snapshot_provenance():
    check_snapshot_provenance(9, sample_version=3, sample_fingerprint=FP_A, snapshot_version=3,
                              snapshot_fingerprint=FP_A)
    wrong_version = _guard_message(check_snapshot_provenance, 9, 3, FP_A, 2, FP_A)
    assert "rollout 9" in wrong_version and "version 3" in wrong_version and "version 2" in wrong_version
    # Right label, wrong weights: caught by the fingerprint recomputed from the snapshot, naming the tensors.
    wrong_weights = _guard_message(check_snapshot_provenance, 9, 3, FP_A, 3, FP_B, ["w (changed)"])
    assert "a" * 12 in wrong_weights and "b" * 12 in wrong_weights and BUG_NOTICE in wrong_weights
    assert "tensors that differ from the push: w (changed)" in wrong_weights


def test_check_snapshot_count():
    check_snapshot_count(10, held_versions=[4, 5], referenced_versions=[4, 5, 5], limit=2)
    check_snapshot_count(10, held_versions=[4, 5, 6], referenced_versions=[6, 5, 4], limit=None)
    for held, referenced, limit in [([3, 4, 5], [4, 5], 2), ([5], [4, 5], 2), ([4, 5, 6], [4, 5, 6], 2)]:
        message = _guard_message(check_snapshot_count, 10, held, referenced, limit)
        assert "rollout 10" in message and f"holds versions {held}" in message and BUG_NOTICE in message
        assert f"referenced are {sorted(set(referenced))}" in message and f"at most {limit}" in message


def test_check_denominator_tolerance():
    check_denominator_tolerance(11, max_abs_diff=0.0, tolerance=1e-4)
    check_denominator_tolerance(11, max_abs_diff=1e-4, tolerance=1e-4)
    for bad in (2e-4, INF, NAN):
        message = _guard_message(check_denominator_tolerance, 11, bad, 1e-4)
        assert "rollout 11" in message and "--keep-old-actor-tol 0.0001" in message
        assert "raise --keep-old-actor-tol" in message
    assert "up to 0.0002 per token" in _guard_message(check_denominator_tolerance, 11, 2e-4, 1e-4)
    assert "up to nan" in _guard_message(check_denominator_tolerance, 11, NAN, 1e-4)


def test_check_rollout_log_probs():
    check_rollout_log_probs(12, [[-0.5, -1.0], [-2.0]], [2, 1])
    for log_probs in ([[-0.5, -1.0], [-2.0, -0.1]], [[-0.5, -1.0], []], [[-0.5, NAN], [-2.0]], [[-0.5, -1.0], [-INF]]):
        message = _guard_message(check_rollout_log_probs, 12, log_probs, [2, 1])
        broken = 0 if not all(map(math.isfinite, log_probs[0])) else 1
        assert f"rollout 12, sample {broken}" in message
        assert f"returned {len(log_probs[broken])} log-probs for a response of {[2, 1][broken]} tokens" in message
        assert "one finite log-prob per token" in message


def test_check_behavior_kl():
    check_behavior_kl(13, policy_behavior_kl=5.0, max_behavior_kl=None, correction="none")
    check_behavior_kl(13, policy_behavior_kl=0.02, max_behavior_kl=0.02, correction="none")
    for kl in (0.05, NAN):
        message = _guard_message(check_behavior_kl, 13, kl, 0.02, "keep_old_actor+tis", error=BehaviorDriftError)
        assert "rollout 13" in message and "--max-behavior-kl 0.02" in message
        assert "correction in effect: keep_old_actor+tis" in message and "raise --max-behavior-kl" in message
    assert issubclass(BehaviorDriftError, OffPolicyGuardError)


# ---------------------------------------------------------------- the mismatch report, by hand


def _pair(log_ratios: list[list[float]]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(old, roll) per sample with old − roll = the given log-ratios; roll values are arbitrary log-probs."""
    roll_values = [[-1.0, -0.5], [-2.0, -1.5, -0.3]]
    roll = [torch.tensor(values, dtype=torch.float64) for values in roll_values]
    old = [r + torch.tensor(ratios, dtype=torch.float64) for r, ratios in zip(roll, log_ratios, strict=True)]
    return old, roll


LN2, LN3 = math.log(2.0), math.log(3.0)
# Two samples, lengths 2 and 3; w = exp(old − roll) = [2, 1] and [0.5, 3, 1].
LOG_RATIOS = [[LN2, 0.0], [-LN2, LN3, 0.0]]


def test_denominator_vs_behavior_hand_computed():
    old, roll = _pair(LOG_RATIOS)
    metrics = denominator_vs_behavior(old, roll, tis_clip=2.5, tis_clip_low=0.6)
    # k3 per token with r = roll − old: w − 1 − ln w = [1 − ln2, 0, ln2 − 1/2, 2 − ln3, 0], summing to 5/2 − ln3.
    # w = [2, 1, 0.5, 3, 1]: mean 1.5; deviations [.5, −.5, −1, 1.5, −.5], squares sum 4, unbiased variance 1.
    # ESS per sample: (2 + 1)² / (2·(4 + 1)) = 0.9 and (0.5 + 3 + 1)² / (3·(0.25 + 9 + 1)) = 20.25/30.75 = 27/41.
    expected = {
        "denominator_behavior_abs_diff_mean": (2 * LN2 + LN3) / 5,
        "denominator_behavior_abs_diff_max": LN3,
        "denominator_behavior_kl": (2.5 - LN3) / 5,
        "tis_raw_min": 0.5,
        "tis_raw_mean": 1.5,
        "tis_raw_max": 3.0,
        "tis_raw_std": 1.0,
        "tis_abs": (1 + 0 + 0.5 + 2 + 0) / 5,
        "tis_applied_min": 0.6,
        "tis_applied_max": 2.5,
        "tis_clip_fraction": 2 / 5,  # 3 > 2.5 and 0.5 < 0.6 (a float32 mean of a bool mask)
        "ess": (0.9 + 27 / 41) / 2,
        "num_tokens": 5.0,
    }
    assert metrics.keys() == expected.keys()
    for name, value in expected.items():
        tolerance = 1e-7 if name == "tis_clip_fraction" else 1e-12
        assert metrics[name] == pytest.approx(value, rel=tolerance, abs=tolerance), name


def test_denominator_vs_behavior_of_identical_log_probs():
    old, roll = _pair([[0.0, 0.0], [0.0, 0.0, 0.0]])
    metrics = denominator_vs_behavior(old, roll, tis_clip=2.0, tis_clip_low=0.0)
    assert metrics["denominator_behavior_kl"] == 0.0 and metrics["denominator_behavior_abs_diff_max"] == 0.0
    for name in ("tis_raw_min", "tis_raw_mean", "tis_raw_max", "tis_applied_min", "tis_applied_max", "ess"):
        assert metrics[name] == 1.0, name
    assert metrics["tis_raw_std"] == 0.0 and metrics["tis_abs"] == 0.0 and metrics["tis_clip_fraction"] == 0.0


def test_denominator_vs_behavior_stays_finite_for_extreme_log_ratios():
    old, roll = _pair([[60.0, 0.0], [-60.0, 0.0, 0.0]])
    metrics = denominator_vs_behavior(old, roll, tis_clip=2.0, tis_clip_low=0.0)
    assert all(math.isfinite(value) for value in metrics.values())
    assert metrics["tis_raw_max"] == pytest.approx(math.exp(20)) and metrics["denominator_behavior_kl"] <= 10.0
    assert metrics["tis_applied_max"] == 2.0 and metrics["tis_clip_fraction"] == pytest.approx(1 / 5)


@pytest.mark.parametrize("seed", [0, 1])
def test_denominator_vs_behavior_ess_matches_the_per_sample_loop(seed):
    """The ESS is taken over a padded (B, T) layout; one call per sample is the reference, on uneven lengths."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [1, 5, 3, 16, 2, 7]
    old = [torch.randn(n, generator=generator) - 1.0 for n in lengths]
    roll = [o + 0.3 * torch.randn(n, generator=generator) for o, n in zip(old, lengths)]
    per_sample = [float(compute_ess_ratio(o - r, torch.ones_like(o))) for o, r in zip(old, roll)]
    metrics = denominator_vs_behavior(old, roll, tis_clip=2.0, tis_clip_low=0.0)
    # A float32 mean of six values in (0, 1]: the two orders of summation differ by a few ulps at most.
    assert metrics["ess"] == pytest.approx(sum(per_sample) / len(per_sample), rel=1e-6)


def test_policy_vs_behavior_hand_computed():
    # current − roll = −LOG_RATIOS; k3 with r = roll − current = LOG_RATIOS: e^{−r} − 1 + r
    # = [ln2 − 1/2, 0, 1 − ln2, ln3 − 2/3, 0], summing to ln3 − 1/6.
    negated = [[-value for value in row] for row in LOG_RATIOS]
    current, roll = _pair(negated)
    current = [lp.clone().requires_grad_(True) for lp in current]  # the training forward pass carries grad
    metrics = policy_vs_behavior(current, roll)
    assert metrics == {
        "policy_behavior_abs_diff": pytest.approx((2 * LN2 + LN3) / 5, rel=1e-12),
        "policy_behavior_kl": pytest.approx((LN3 - 1 / 6) / 5, rel=1e-12),
    }
    same, roll = _pair([[0.0, 0.0], [0.0, 0.0, 0.0]])
    assert policy_vs_behavior(same, roll) == {"policy_behavior_abs_diff": 0.0, "policy_behavior_kl": 0.0}


# ---------------------------------------------------------------- the label in effect (the corrections table)


@pytest.mark.parametrize(
    "use_rollout_logprobs, use_tis, keep_old_actor, label",
    [
        (False, False, False, "none"),
        (False, False, True, "keep_old_actor"),
        (False, True, False, "tis"),
        (False, True, True, "keep_old_actor+tis"),
        (True, False, False, "rollout_logprobs"),
        (True, False, True, "rollout_logprobs+keep_old_actor(metrics)"),
    ],
)
def test_the_label_in_effect(use_rollout_logprobs, use_tis, keep_old_actor, label):
    args = SimpleNamespace(use_rollout_logprobs=use_rollout_logprobs, use_tis=use_tis, keep_old_actor=keep_old_actor)
    assert in_effect(args).label == label


@pytest.mark.parametrize("keep_old_actor", [False, True])
def test_no_run_reaches_rollout_logprobs_with_tis(keep_old_actor):
    argv = ["--use-rollout-logprobs", "--use-tis"] + (["--keep-old-actor"] if keep_old_actor else [])
    with pytest.raises(MilesConfigError, match="exclude each other"):
        parse_args(argv=argv)


# ---------------------------------------------------------------- E_roll[π_old / π_roll] = 1


def _sampled_tis_raw_mean(sample_from_roll: bool, seed: int = 0) -> tuple[float, float]:
    """tis_raw_mean and its standard error for tokens drawn from `roll` (or, as a control, from `old`)."""
    generator = torch.Generator().manual_seed(seed)
    vocab, num_samples, length = 12, 400, 8
    roll_log_probs = torch.log_softmax(torch.randn(vocab, generator=generator, dtype=torch.float64), dim=0)
    old_log_probs = torch.log_softmax(torch.randn(vocab, generator=generator, dtype=torch.float64), dim=0)
    sampling = roll_log_probs if sample_from_roll else old_log_probs
    tokens = torch.multinomial(sampling.exp(), num_samples * length, replacement=True, generator=generator)
    tokens = tokens.view(num_samples, length)  # (B, T)
    metrics = denominator_vs_behavior(
        [old_log_probs[row] for row in tokens], [roll_log_probs[row] for row in tokens], tis_clip=2.0, tis_clip_low=0.0
    )
    return metrics["tis_raw_mean"], metrics["tis_raw_std"] / math.sqrt(metrics["num_tokens"])


def test_raw_tis_weights_average_one_under_the_behavior_policy():
    mean, standard_error = _sampled_tis_raw_mean(sample_from_roll=True)
    assert abs(mean - 1.0) < 4 * standard_error
    # The control draws from the wrong policy: E_old[π_old/π_roll] = 1 + χ²(old ‖ roll) > 1: the check can fail.
    control_mean, control_error = _sampled_tis_raw_mean(sample_from_roll=False)
    assert control_mean - 1.0 > 4 * control_error
