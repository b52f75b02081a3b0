"""Rewards → per-sample advantages and returns, per estimator, against hand-computed values and loops."""

import math
import statistics

import pytest
import torch

from miles.backends.training_utils.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages_and_returns,
)


def mask(*bits):
    return torch.tensor(bits, dtype=torch.int64)


def f32(*values):
    return torch.tensor(values, dtype=torch.float32)


def run(estimator, rewards, loss_masks, values=None, group_size=2, gamma=1.0, lambd=1.0, std=True, normalize=False,
        kl=None, kl_coef=0.0):
    return compute_advantages_and_returns(
        estimator, rewards, loss_masks, values, group_size, gamma, lambd, std, normalize, kl=kl, kl_coef=kl_coef
    )


def assert_lists_close(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, torch.as_tensor(e, dtype=a.dtype))


@pytest.mark.parametrize("estimator", ["grpo", "gspo"])
def test_group_relative_broadcasts_the_normalized_reward_to_unmasked_tokens(estimator):
    rewards = [1.0, 0.0, 0.5, 0.5]  # two groups of two; the second has zero std
    loss_masks = [mask(1, 1, 0), mask(1), mask(1, 1), mask(0, 1)]
    advantages, returns = run(estimator, rewards, loss_masks)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # Bessel std of {1, 0} is sqrt(0.5)
    assert_lists_close(advantages, [[a, a, 0.0], [-a], [0.0, 0.0], [0.0, 0.0]])
    assert returns is advantages
    advantages, _ = run(estimator, rewards, loss_masks, std=False)
    assert_lists_close(advantages, [[0.5, 0.5, 0.0], [-0.5], [0.0, 0.0], [0.0, 0.0]])


def test_group_relative_matches_statistics_module_for_larger_groups():
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    loss_masks = [torch.ones(3, dtype=torch.int64)] * 8
    advantages, _ = run("grpo", rewards, loss_masks, group_size=4)
    for g in range(2):
        group = rewards[4 * g : 4 * g + 4]
        for i, r in enumerate(group):
            expected = (r - statistics.mean(group)) / (statistics.stdev(group) + 1e-6)
            torch.testing.assert_close(advantages[4 * g + i], torch.full((3,), expected, dtype=torch.float32))


def loop_gae(values, rewards, gamma, lambd):
    advantages, next_value, running = [0.0] * len(values), 0.0, 0.0
    for k in reversed(range(len(values))):
        running = rewards[k] + gamma * next_value - values[k] + gamma * lambd * running
        next_value = values[k]
        advantages[k] = running
    return advantages


def test_ppo_is_gae_with_the_reward_at_the_last_unmasked_token():
    values = [f32(0.5, 0.2, 0.1, 9.0), f32(0.3, 0.4)]
    loss_masks = [mask(1, 1, 1, 0), mask(1, 1)]
    advantages, returns = run("ppo", [1.0, -1.0], loss_masks, values, gamma=0.9, lambd=0.8)
    expected_0 = loop_gae([0.5, 0.2, 0.1], [0.0, 0.0, 1.0], 0.9, 0.8)
    expected_1 = loop_gae([0.3, 0.4], [0.0, -1.0], 0.9, 0.8)
    assert_lists_close(advantages, [expected_0 + [0.0], expected_1])
    assert_lists_close(returns, [[a + v for a, v in zip(expected_0, [0.5, 0.2, 0.1])] + [0.0],
                                 [a + v for a, v in zip(expected_1, [0.3, 0.4])]])
    # hand value of the last token of sample 0: δ = 1 − 0.1 = 0.9
    assert advantages[0][2].item() == pytest.approx(0.9)


def test_ppo_with_gamma_and_lambda_one_gives_reward_minus_value():
    values = [f32(0.25, 0.5, 0.75)]
    advantages, returns = run("ppo", [1.0], [mask(1, 1, 1)], values, group_size=1)
    assert_lists_close(advantages, [[0.75, 0.5, 0.25]])
    assert_lists_close(returns, [[1.0, 1.0, 1.0]])


def test_ppo_requires_values():
    with pytest.raises(ValueError, match="needs the critic's values"):
        run("ppo", [1.0], [mask(1)], values=None, group_size=1)


def test_reinforce_plus_plus_discounts_token_rewards_with_kl_shaping():
    kl = [f32(0.1, 0.2, 0.3, 5.0)]
    loss_masks = [mask(1, 1, 1, 0)]
    advantages, returns = run("reinforce_plus_plus", [1.0], loss_masks, group_size=1, gamma=0.5, kl=kl, kl_coef=0.1)
    r = [-0.01, -0.02, -0.03 + 1.0]  # −kl_coef·kl, reward at the last unmasked token; masked token dropped
    g2 = r[2]
    g1 = r[1] + 0.5 * g2
    g0 = r[0] + 0.5 * g1
    assert_lists_close(returns, [[g0, g1, g2, 0.0]])
    assert returns is advantages


def test_reinforce_plus_plus_skips_masked_tokens_and_zero_fills_a_fully_masked_sample():
    advantages, _ = run("reinforce_plus_plus", [2.0, 3.0], [mask(1, 0, 1), mask(0, 0)], group_size=1, gamma=0.5)
    assert_lists_close(advantages, [[1.0, 0.0, 2.0], [0.0, 0.0]])


def test_reinforce_plus_plus_baseline_subtracts_the_group_mean_and_kl():
    kl = [f32(0.5, 1.0), f32(2.0, 0.0)]
    advantages, returns = run(
        "reinforce_plus_plus_baseline", [1.0, 0.0], [mask(1, 1), mask(1, 0)], kl=kl, kl_coef=0.1
    )
    assert_lists_close(advantages, [[0.5 - 0.05, 0.5 - 0.1], [-0.5 - 0.2, 0.0]])
    assert returns is advantages


def test_normalize_whitens_advantages_over_the_whole_rollout_and_keeps_returns():
    loss_masks = [mask(1, 1, 0), mask(1), mask(1, 1)]
    rewards = [1.0, 2.0, 4.0]
    advantages, returns = run("reinforce_plus_plus", rewards, loss_masks, group_size=1, normalize=True)
    raw = [1.0, 1.0, 2.0, 4.0, 4.0]  # returns with gamma 1 on the unmasked tokens
    mean, std = statistics.mean(raw), statistics.stdev(raw)
    z = [(x - mean) / math.sqrt(std**2 + 1e-8) for x in raw]
    assert_lists_close(advantages, [[z[0], z[1], 0.0], [z[2]], [z[3], z[4]]])
    assert_lists_close(returns, [[1.0, 1.0, 0.0], [2.0], [4.0, 4.0]])


def test_outputs_carry_no_grad():
    values = [f32(0.1, 0.2).requires_grad_(True)]
    for estimator in ADVANTAGE_ESTIMATORS:
        advantages, returns = run(estimator, [1.0], [mask(1, 1)], values, group_size=1)
        assert not advantages[0].requires_grad and not returns[0].requires_grad


def test_errors_name_the_value_and_the_fix():
    with pytest.raises(ValueError, match="grpo, gspo, ppo"):
        run("a2c", [1.0], [mask(1)])
    with pytest.raises(ValueError, match="use-kl-loss"):
        run("grpo", [1.0, 0.0], [mask(1), mask(1)], kl=[f32(0.1), f32(0.1)], kl_coef=0.1)
    with pytest.raises(ValueError, match="no per-token kl"):
        run("reinforce_plus_plus", [1.0], [mask(1)], group_size=1, kl_coef=0.1)
    with pytest.raises(ValueError, match="one per sample"):
        run("grpo", [1.0], [mask(1), mask(1)])
    with pytest.raises(ValueError, match="groups of 2"):
        run("grpo", [1.0, 0.0, 1.0], [mask(1)] * 3)
    with pytest.raises(ValueError, match="values has per-sample lengths"):
        run("ppo", [1.0], [mask(1, 1)], [f32(0.1)], group_size=1)


# ---------------------------------------------------------------------------------------------------------------
# The estimators work on the whole rollout in a padded layout; a per-sample, per-token loop in plain Python floats
# is the reference, on random rollouts with masked tokens, fully masked samples and uneven lengths.
# ---------------------------------------------------------------------------------------------------------------


def loop_token_rewards(reward, mask_bits, kl, kl_coef):
    """−kl_coef·kl on the unmasked tokens, plus the reward at the last unmasked token."""
    token_rewards = [-kl_coef * k if m else 0.0 for m, k in zip(mask_bits, kl)]
    unmasked = [t for t, m in enumerate(mask_bits) if m]
    if unmasked:
        token_rewards[unmasked[-1]] += reward
    return token_rewards


def loop_discounted(token_rewards, mask_bits, gamma):
    """G_t = r_t + γ·G_next over the unmasked tokens only; 0 at masked ones."""
    returns, running = [0.0] * len(mask_bits), 0.0
    for t in reversed(range(len(mask_bits))):
        if mask_bits[t]:
            running = token_rewards[t] + gamma * running
            returns[t] = running
    return returns


def loop_reference(estimator, rewards, masks, values, kl, kl_coef, group_size, gamma, lambd):
    """Per-sample advantages and returns, one sample and one token at a time (the module docstring's formulas)."""
    groups = [rewards[g : g + group_size] for g in range(0, len(rewards), group_size)]
    advantages, returns = [], []
    for i, (reward, mask_bits, kl_i) in enumerate(zip(rewards, masks, kl)):
        group = groups[i // group_size]
        penalty = [-kl_coef * k if m else 0.0 for m, k in zip(mask_bits, kl_i)]
        if estimator == "grpo":
            scalar = (reward - statistics.mean(group)) / (statistics.stdev(group) + 1e-6)
            advantage = [scalar if m else 0.0 for m in mask_bits]
            advantages.append(advantage)
            returns.append(advantage)
        elif estimator == "reinforce_plus_plus_baseline":
            advantage = [(reward - statistics.mean(group) if m else 0.0) + p for m, p in zip(mask_bits, penalty)]
            advantages.append(advantage)
            returns.append(advantage)
        elif estimator == "reinforce_plus_plus":
            discounted = loop_discounted(loop_token_rewards(reward, mask_bits, kl_i, kl_coef), mask_bits, gamma)
            advantages.append(discounted)
            returns.append(discounted)
        else:  # ppo: GAE over the unmasked tokens as if the masked ones were absent
            kept = [t for t, m in enumerate(mask_bits) if m]
            token_rewards = loop_token_rewards(reward, mask_bits, kl_i, kl_coef)
            gae = loop_gae([values[i][t] for t in kept], [token_rewards[t] for t in kept], gamma, lambd)
            advantage = [0.0] * len(mask_bits)
            for t, a in zip(kept, gae):
                advantage[t] = a
            advantages.append(advantage)
            returns.append([a + v if m else 0.0 for a, v, m in zip(advantage, values[i], mask_bits)])
    return advantages, returns


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("estimator", ["grpo", "ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_estimators_match_the_per_sample_loop_reference(estimator, seed):
    generator = torch.Generator().manual_seed(seed)
    group_size, num_samples = 4, 12
    lengths = torch.randint(1, 7, (num_samples,), generator=generator).tolist()
    masks = [(torch.rand(n, generator=generator) < 0.8).long().tolist() for n in lengths]
    masks[5] = [0] * lengths[5]  # a fully masked sample
    rewards = torch.randint(0, 3, (num_samples,), generator=generator).float().tolist()
    rewards[:group_size] = [1.0, 0.0, 1.0, 0.0]  # at least one group whose rewards differ
    values = [torch.randn(n, generator=generator).tolist() for n in lengths]
    kl = [torch.randn(n, generator=generator).tolist() for n in lengths]
    kl_coef = 0.0 if estimator == "grpo" else 0.3
    gamma, lambd = 0.9, 0.8
    advantages, returns = run(
        estimator, rewards, [torch.tensor(m) for m in masks], [torch.tensor(v) for v in values],
        group_size=group_size, gamma=gamma, lambd=lambd, kl=[torch.tensor(k) for k in kl], kl_coef=kl_coef,
    )
    expected_advantages, expected_returns = loop_reference(
        estimator, rewards, masks, values, kl, kl_coef, group_size, gamma, lambd
    )
    # float32 against Python floats: a few roundings of values of order 1 (GAE: ~6 terms), far below 1e-5.
    assert_lists_close(advantages, expected_advantages)
    assert_lists_close(returns, expected_returns)
    assert [a.shape[0] for a in advantages] == lengths
