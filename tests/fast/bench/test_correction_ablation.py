"""The correction ablation's own logic: the in-process contract switch, the per-run numbers and the seed spread."""

import asyncio
import math
import sys
from pathlib import Path

import pytest

import train_async
from miles.utils.arguments import parse_args, validate_async_off_policy_correction
from miles.utils.errors import AsyncOffPolicyCorrectionError

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import correction_ablation as ablation  # noqa: E402  (bench/ is a folder of scripts, not a package)


class _ReachedAllocation(Exception):
    """Raised by what train_async.train calls once the contract has passed."""


@pytest.fixture
def stop_after_the_contract(monkeypatch):
    def reached(*_args, **_kwargs):
        raise _ReachedAllocation

    monkeypatch.setattr(train_async, "check_async_max_weight_staleness", reached)


def test_contract_switch_lets_uncorrected_ppo_through_only_inside_the_block(stop_after_the_contract):
    args = parse_args(argv=["--advantage-estimator", "ppo"])
    with ablation.contract_switched_off():
        with pytest.raises(_ReachedAllocation):
            asyncio.run(train_async.train(args))
    assert train_async.validate_async_off_policy_correction is validate_async_off_policy_correction
    with pytest.raises(AsyncOffPolicyCorrectionError):
        asyncio.run(train_async.train(args))


def test_contract_switch_is_restored_when_the_run_fails():
    with pytest.raises(RuntimeError, match="run failed"):
        with ablation.contract_switched_off():
            raise RuntimeError("run failed")
    assert train_async.validate_async_off_policy_correction is validate_async_off_policy_correction


def test_every_async_arm_runs_at_each_interval_and_sync_ppo_once():
    configs = ablation.arm_configs((1, 4))
    assert configs.count((ablation.REFERENCE, None)) == 1
    assert len(configs) == 1 + 2 * (len(ablation.ARMS) - 1)
    assert (ablation.UNCORRECTED_PPO, 4) in configs


def test_arms_filter_keeps_sync_ppo_and_the_new_arms_are_there():
    assert ablation.arm_configs((4,), ("ppo+icepop",)) == [(ablation.REFERENCE, None), ("ppo+icepop", 4)]
    assert {"ppo+icepop", "ppo+geo-mask", "ppo+seq-tis", "ppo+opsm", "ppo+opsm+tis"} <= set(ablation.ARMS)
    assert set(ablation.CONTRACT_OFF_ARMS) == {ablation.UNCORRECTED_PPO, "ppo+opsm"}  # OPSM alone is refused too


def test_the_headline_is_the_training_reward_with_its_spread():
    runs = {label: {str(seed): [{"rollout_id": k, "time": float(k), "rollout/reward_mean": reward + 0.1 * seed,
                                 "eval/accuracy": 0.1} for k in range(12)] for seed in range(2)}
            for label, reward in (("sync-ppo", 0.3), ("ppo+icepop N=4", 0.2))}
    _, (accuracy_line, headline) = ablation.report_rows({"settings": {}, "runs": runs})
    assert accuracy_line.startswith("final eval accuracy relative to sync PPO")
    assert headline == ("training reward (mean of the last 10 rollouts, mean ± sd over seeds): "
                        "sync-ppo 0.350 ± 0.071; ppo+icepop N=4 0.250 ± 0.071")


def _record(rollout_id, time, **metrics):
    return {"rollout_id": rollout_id, "time": time, **metrics}


def test_run_numbers_reads_the_last_eval_the_last_rewards_and_run_means():
    records = [_record(k, 10.0 + 0.5 * k, **{"rollout/reward_mean": k / 20, "train/pg_clipfrac": 0.1 * (k % 2)})
               for k in range(20)]
    for rollout_id, accuracy in [(4, 0.9), (9, 0.25), (14, 0.5), (19, 0.6)]:
        records[rollout_id]["eval/accuracy"] = accuracy
    numbers = ablation.run_numbers(records)
    assert numbers["final eval"] == pytest.approx(0.45)  # the last three evaluations: (0.25 + 0.5 + 0.6) / 3
    assert numbers["reward"] == pytest.approx(sum(range(10, 20)) / 20 / 10)  # the last 10 rollouts
    assert numbers["clip frac"] == pytest.approx(0.05)  # 0 and 0.1, alternating
    assert numbers["wall ms"] == pytest.approx(500.0)
    assert numbers["ESS"] is None  # never logged (e.g. --use-rollout-logprobs): unknown, not 0


def test_beyond_seed_spread_is_two_standard_errors_of_the_difference():
    reference = [0.4, 0.5, 0.6]  # mean 0.5, sd 0.1
    # sd 0.1 on both sides, n = 3: 2 * sqrt(0.01/3 + 0.01/3) = 0.1633
    assert ablation.beyond_seed_spread([0.57, 0.67, 0.77], reference) is True  # delta 0.17
    assert ablation.beyond_seed_spread([0.55, 0.65, 0.75], reference) is False  # delta 0.15
    assert ablation.beyond_seed_spread([0.9], reference) is None  # one seed: no spread to compare with


def test_eval_curves_take_mean_min_max_over_seeds_at_common_rollouts():
    seeds = {"0": [_record(9, 0, **{"eval/accuracy": 0.2}), _record(19, 0, **{"eval/accuracy": 0.4})],
             "1": [_record(9, 0, **{"eval/accuracy": 0.3})]}
    x, mean, low, high = ablation.eval_curves(seeds)
    assert x == [9.0] and low == [0.2] and high == [0.3]
    assert math.isclose(mean[0], 0.25)


def test_table_cells_mark_values_beyond_the_seed_spread():
    reference = [0.4, 0.5, 0.6]
    assert ablation.compared_cell([0.57, 0.67, 0.77], reference, 3) == "0.670 ± 0.100 *"
    assert ablation.compared_cell([0.55, 0.65, 0.75], reference, 3) == "0.650 ± 0.100"
    assert ablation.compared_cell(reference, reference, 3) == "0.500 ± 0.100"  # the reference row itself


def test_reward_curves_average_whole_blocks_of_rollouts_per_seed():
    seeds = {"0": [_record(k, 0, **{"rollout/reward_mean": float(k)}) for k in range(25)],
             "1": [_record(k, 0, **{"rollout/reward_mean": 0.0}) for k in range(20)]}
    x, mean, low, high = ablation.reward_curves(seeds)
    assert x == [9.0, 19.0]  # seed 0's last five rollouts make no whole block
    assert low == [0.0, 0.0] and high == [4.5, 14.5]  # block means of 0..9 and 10..19
    assert mean == [2.25, 7.25]


# The denominator each arm trains with (the actor's own label, logged as off_policy/correction), written out by hand:
# the uncorrected arms are uncorrected, every corrected arm corrected. The e2e smoke test runs some arms for real.
EXPECTED_CORRECTION = {
    "sync-ppo": "none", "ppo+rollout-logprobs": "rollout_logprobs", "ppo+tis": "tis",
    "ppo+keep-old-actor": "keep_old_actor", "ppo-uncorrected": "none", "grpo": "none", "grpo+tis": "tis",
    "ppo+icepop": "tis", "ppo+geo-mask": "tis", "ppo+seq-tis": "tis", "ppo+opsm": "none", "ppo+opsm+tis": "tis",
}


@pytest.mark.parametrize("arm", list(ablation.ARMS))
def test_every_arm_is_a_launch_the_driver_takes_with_its_correction(arm):
    from miles.config import corrections

    driver, flags = ablation.ARMS[arm]
    args = parse_args(argv=ablation.training_argv(2, flags))
    assert corrections.in_effect(args).label == EXPECTED_CORRECTION[arm]
    if arm in ablation.CONTRACT_OFF_ARMS:  # async, refused unless the bench switches the contract off
        with pytest.raises(AsyncOffPolicyCorrectionError):
            validate_async_off_policy_correction(args)
    elif driver == "async":
        validate_async_off_policy_correction(args)
    assert set(EXPECTED_CORRECTION) == set(ablation.ARMS) and driver in ("sync", "async")
