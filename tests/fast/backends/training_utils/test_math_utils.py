"""The pure loss/advantage math against hand-computed values and plain-Python loop references."""

import math
import random
import statistics
import types

import pytest
import torch

from miles.backends.training_utils.loss_hub.math_utils import (
    compute_approx_kl,
    compute_ess_ratio,
    compute_gspo_kl,
    compute_opsm_mask,
    compute_policy_loss,
    compute_value_loss,
    chunked_gae,
    get_advantages_and_returns,
    get_advantages_and_returns_batch,
    get_grpo_returns,
    get_reinforce_plus_plus_returns,
    group_normalize_rewards,
    normalize_advantages,
    sum_of_sample_mean,
    sum_of_token,
    vanilla_gae,
)

NAN, INF = float("nan"), float("inf")
SEEDS_AND_SHAPES = [(0, (7,)), (1, (3, 5)), (2, (2, 4, 6))]


def t(values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


# ---------------------------------------------------------------- plain-Python references (one token at a time)


def ref_policy_loss_token(ppo_kl, advantage, eps_clip, eps_clip_high, eps_clip_c=None):
    ratio = math.exp(max(-20.0, min(20.0, -ppo_kl)))
    unclipped = -ratio * advantage
    clipped = -min(max(ratio, 1 - eps_clip), 1 + eps_clip_high) * advantage
    loss = max(unclipped, clipped)
    clipfrac = 1.0 if clipped > unclipped else 0.0
    if eps_clip_c is not None and advantage < 0:
        loss = min(loss, -eps_clip_c * advantage)
    return loss, clipfrac


def ref_kl_token(lp, base, kind):
    r = lp - base
    if kind == "k1":
        return r
    if kind == "k2":
        return r * r / 2
    if kind == "low_var_kl":
        r = max(-20.0, min(20.0, r))
        return max(-10.0, min(10.0, math.exp(-r) - 1 + r))
    return math.exp(-r) - 1 + r


def ref_gae(values, rewards, gamma, lambd):
    n = len(values)
    advantages = [0.0] * n
    for t_ in range(n):  # forward definition: A_t = Σ_l (γλ)^l δ_{t+l}
        total = 0.0
        for l in range(n - t_):
            k = t_ + l
            next_value = values[k + 1] if k + 1 < n else 0.0
            total += (gamma * lambd) ** l * (rewards[k] + gamma * next_value - values[k])
        advantages[t_] = total
    return advantages, [a + v for a, v in zip(advantages, values)]


def random_tensor(seed, shape, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64) * scale


# ---------------------------------------------------------------- compute_policy_loss


def test_policy_loss_hand_computed_clipping_on_both_sides():
    # ratio = exp(-ppo_kl): 1.0 (inside), 1.5 (above 1+0.28), 0.5 (below 1-0.2)
    ppo_kl = t([0.0, -math.log(1.5), -math.log(0.5), -math.log(1.5), -math.log(0.5)])
    advantages = t([2.0, 1.0, 1.0, -1.0, -1.0])
    pg, clipfrac = compute_policy_loss(ppo_kl, advantages, eps_clip=0.2, eps_clip_high=0.28)
    # A>0, r=1.5: max(-1.5, -1.28) = -1.28 (clipped); A>0, r=0.5: max(-0.5, -0.8) = -0.5 (not clipped)
    # A<0, r=1.5: max(1.5, 1.28) = 1.5 (not clipped); A<0, r=0.5: max(0.5, 0.8) = 0.8 (clipped)
    torch.testing.assert_close(pg, t([-2.0, -1.28, -0.5, 1.5, 0.8]))
    torch.testing.assert_close(clipfrac, t([0.0, 1.0, 0.0, 0.0, 1.0]))


def test_policy_loss_dual_clip_caps_negative_advantages_and_clipfrac_is_taken_before():
    ppo_kl = t([-math.log(5.0), -math.log(5.0), -math.log(0.1)])  # ratios 5, 5, 0.1
    advantages = t([-1.0, 1.0, -2.0])
    pg, clipfrac = compute_policy_loss(ppo_kl, advantages, 0.2, 0.2, eps_clip_c=3.0)
    # A=-1, r=5: max(5, 1.2) = 5, dual clip min(5, 3) = 3 ; A=+1: untouched -1.2 (clipped)
    # A=-2, r=0.1: max(0.2, 1.6) = 1.6 (clipped), dual min(1.6, 6) = 1.6
    torch.testing.assert_close(pg, t([3.0, -1.2, 1.6]))
    torch.testing.assert_close(clipfrac, t([0.0, 1.0, 1.0]))


@pytest.mark.parametrize("eps_clip_c", [1.0, 0.5])
def test_policy_loss_rejects_dual_clip_at_or_below_one(eps_clip_c):
    with pytest.raises(ValueError, match="must be > 1"):
        compute_policy_loss(t([0.0]), t([1.0]), 0.2, 0.2, eps_clip_c=eps_clip_c)


@pytest.mark.parametrize("seed,shape", SEEDS_AND_SHAPES)
@pytest.mark.parametrize("eps_clip,eps_clip_high,eps_clip_c", [(0.2, 0.2, None), (0.1, 0.3, None), (0.2, 0.28, 3.0)])
def test_policy_loss_matches_loop_reference(seed, shape, eps_clip, eps_clip_high, eps_clip_c):
    ppo_kl = random_tensor(seed, shape)
    advantages = random_tensor(seed + 100, shape)
    pg, clipfrac = compute_policy_loss(ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c)
    expected = [
        ref_policy_loss_token(k, a, eps_clip, eps_clip_high, eps_clip_c)
        for k, a in zip(ppo_kl.flatten().tolist(), advantages.flatten().tolist())
    ]
    torch.testing.assert_close(pg.flatten(), t([e[0] for e in expected]))
    torch.testing.assert_close(clipfrac.flatten(), t([e[1] for e in expected]))
    assert 0.0 < clipfrac.mean() < 1.0  # the random case really exercises both branches


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_policy_loss_non_finite_log_ratios_never_poison(dtype):
    ppo_kl = torch.tensor([NAN, INF, -INF, 50.0, -50.0], dtype=dtype, requires_grad=True)
    pg, _ = compute_policy_loss(ppo_kl, torch.zeros(5, dtype=dtype), 0.2, 0.2, eps_clip_c=3.0)
    assert torch.equal(pg, torch.zeros(5, dtype=dtype))  # exactly 0 with a zero advantage
    pg_nonzero, clipfrac = compute_policy_loss(ppo_kl, torch.full((5,), -1.0, dtype=dtype), 0.2, 0.2)
    assert torch.isfinite(pg_nonzero).all() and torch.isfinite(clipfrac).all()
    pg_nonzero.sum().backward()
    assert torch.isfinite(ppo_kl.grad).all()


# ---------------------------------------------------------------- compute_approx_kl


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl"])
@pytest.mark.parametrize("seed,shape", SEEDS_AND_SHAPES)
def test_approx_kl_matches_loop_reference(kind, seed, shape):
    log_probs, base = random_tensor(seed, shape, 2.0), random_tensor(seed + 1, shape, 2.0)
    kl = compute_approx_kl(log_probs, base, kind)
    expected = [ref_kl_token(a, b, kind) for a, b in zip(log_probs.flatten().tolist(), base.flatten().tolist())]
    torch.testing.assert_close(kl.flatten(), t(expected))


def test_approx_kl_hand_computed():
    log_probs, base = t([math.log(0.5)]), t([math.log(0.25)])  # r = ln 2
    r = math.log(2.0)
    assert compute_approx_kl(log_probs, base, "k1").item() == pytest.approx(r)
    assert compute_approx_kl(log_probs, base, "k2").item() == pytest.approx(r * r / 2)
    assert compute_approx_kl(log_probs, base, "k3").item() == pytest.approx(0.5 - 1 + r)


def test_low_var_kl_is_finite_and_clamped_for_extreme_inputs():
    log_probs = t([NAN, INF, -INF, 50.0, -50.0, 0.0], torch.float32)
    kl = compute_approx_kl(log_probs, torch.zeros(6), "low_var_kl")
    assert torch.isfinite(kl).all()
    assert kl.min() >= -10 and kl.max() <= 10
    # NaN → r = 0 → 0; r ≥ 20: e^-20 − 1 + 20 ≈ 19 → 10; r ≤ −20: e^20 − 21 → 10
    assert kl.tolist() == [0.0, 10.0, 10.0, 10.0, 10.0, 0.0]


def test_approx_kl_importance_ratio_multiplies_the_estimate():
    log_probs, base, ratio = t([0.3, -0.2]), t([0.1, 0.1]), t([2.0, 0.5])
    torch.testing.assert_close(compute_approx_kl(log_probs, base, "k1", ratio), t([0.4, -0.15]))


def test_approx_kl_unknown_type_lists_the_valid_names():
    with pytest.raises(ValueError, match="k1, k2, k3, low_var_kl"):
        compute_approx_kl(t([0.0]), t([0.0]), "k4")


# ---------------------------------------------------------------- compute_value_loss


def test_value_loss_hand_computed():
    values, old_values, returns = t([1.0, 0.5, 0.0]), t([0.5, 0.5, 0.4]), t([0.0, 1.0, 1.0])
    losses, clipfrac = compute_value_loss(values, old_values, returns, value_clip=0.2)
    # v=1.0: v_clip = 0.7 → max(0.49, 1.0) = 1.0, clipped; v=0.5: unchanged → 0.25;
    # v=0.0: v_clip = 0.2 → max(0.64, 1.0) = 1.0, clipped
    torch.testing.assert_close(losses, t([1.0, 0.25, 1.0]))
    torch.testing.assert_close(clipfrac, t([1.0, 0.0, 1.0]))
    # the clipped term wins when the new value moved towards the return past the clip
    losses, _ = compute_value_loss(t([0.9]), t([0.0]), t([1.0]), value_clip=0.2)
    torch.testing.assert_close(losses, t([0.64]))


@pytest.mark.parametrize("seed,shape", SEEDS_AND_SHAPES)
def test_value_loss_matches_loop_reference(seed, shape):
    values, old, returns = (random_tensor(seed + k, shape) for k in range(3))
    losses, clipfrac = compute_value_loss(values, old, returns, 0.3)
    expected_losses, expected_clip = [], []
    for v, o, r in zip(values.flatten().tolist(), old.flatten().tolist(), returns.flatten().tolist()):
        v_clip = o + max(-0.3, min(0.3, v - o))
        expected_losses.append(max((v_clip - r) ** 2, (v - r) ** 2))
        expected_clip.append(1.0 if abs(v - o) > 0.3 else 0.0)
    torch.testing.assert_close(losses.flatten(), t(expected_losses))
    torch.testing.assert_close(clipfrac.flatten(), t(expected_clip))


# ---------------------------------------------------------------- GAE and REINFORCE++ returns


def _batch(values, rewards, terminal_rewards, masks, gamma, lambd, chunked, bootstrap_values=None):
    lengths = [v.numel() for v in values]
    return get_advantages_and_returns_batch(lengths, lengths, values, rewards, terminal_rewards, "thd", None, masks,
                                            gamma, lambd, chunked=chunked, bootstrap_values=bootstrap_values)


def test_gae_hand_computed_with_gamma_and_lambda():
    values, rewards, gamma, lambd = t([0.5, 0.2, 0.1]), t([0.0, 0.0, 1.0]), 0.9, 0.8
    advantages, returns = get_advantages_and_returns(3, 3, values, rewards, gamma, lambd)
    d2 = 1.0 + 0.0 - 0.1  # 0.9
    d1 = 0.0 + 0.9 * 0.1 - 0.2  # -0.11
    d0 = 0.0 + 0.9 * 0.2 - 0.5  # -0.32
    a2 = d2
    a1 = d1 + 0.72 * a2  # 0.538
    a0 = d0 + 0.72 * a1  # 0.06736
    torch.testing.assert_close(advantages, t([a0, a1, a2]))
    torch.testing.assert_close(returns, t([a0 + 0.5, a1 + 0.2, a2 + 0.1]))


@pytest.mark.parametrize("seed,length", [(0, 1), (1, 4), (2, 9)])
@pytest.mark.parametrize("gamma,lambd", [(1.0, 1.0), (0.9, 0.8), (0.5, 0.0)])
def test_gae_matches_forward_sum_reference(seed, length, gamma, lambd):
    values, rewards = random_tensor(seed, (length,)), random_tensor(seed + 7, (length,))
    advantages, returns = get_advantages_and_returns(length, length, values, rewards, gamma, lambd)
    expected_adv, expected_ret = ref_gae(values.tolist(), rewards.tolist(), gamma, lambd)
    torch.testing.assert_close(advantages, t(expected_adv))
    torch.testing.assert_close(returns, t(expected_ret))


@pytest.mark.parametrize("chunked", [False, True])
def test_batch_gae_skips_masked_positions_and_rewards_the_last_kept_token(chunked):
    values = t([0.5, 9.0, 0.2, 9.0, 0.1, 9.0])
    rewards = t([0.0, 5.0, 0.0, 5.0, 0.0, 5.0])
    mask = torch.tensor([1, 0, 1, 0, 1, 0])
    (advantages,), (returns,) = _batch([values], [rewards], [1.0], [mask], 0.9, 0.8, chunked)
    compact_adv, compact_ret = ref_gae([0.5, 0.2, 0.1], [0.0, 0.0, 1.0], 0.9, 0.8)
    torch.testing.assert_close(advantages, t([compact_adv[0], 0, compact_adv[1], 0, compact_adv[2], 0]))
    torch.testing.assert_close(returns, t([compact_ret[0], 0, compact_ret[1], 0, compact_ret[2], 0]))


@pytest.mark.parametrize("chunked", [False, True])
def test_batch_gae_bootstraps_a_truncated_response_and_zeroes_a_fully_masked_one(chunked):
    values, rewards = [t([1.0, 2.0, 9.0]), t([3.0, 4.0])], [t([0.0, 0.5, 7.0]), t([1.0, 1.0])]
    masks = [torch.tensor([1, 1, 0]), torch.zeros(2)]
    advantages, returns = _batch(values, rewards, [3.0, 5.0], masks, 0.9, 0.5, chunked, bootstrap_values=[4.0, 1.0])
    d1 = 0.5 + 3.0 + 0.9 * 4.0 - 2.0  # the last kept token: its reward, the terminal reward, γ·bootstrap − V
    d0 = 0.0 + 0.9 * 2.0 - 1.0
    a0 = d0 + 0.9 * 0.5 * d1
    torch.testing.assert_close(advantages[0], t([a0, d1, 0.0]))
    torch.testing.assert_close(returns[0], t([a0 + 1.0, d1 + 2.0, 0.0]))
    assert advantages[1].tolist() == [0.0, 0.0] and returns[1].tolist() == [0.0, 0.0]


def test_gae_outputs_carry_no_grad():
    values = t([0.3, 0.4]).requires_grad_(True)
    advantages, returns = get_advantages_and_returns(2, 2, values, t([0.0, 1.0]), 1.0, 1.0)
    assert not advantages.requires_grad and not returns.requires_grad


@pytest.mark.parametrize("chunk_size", [1, 3, 8, 64])
@pytest.mark.parametrize("gamma,lambd", [(0.99, 0.95), (0.9, 0.0), (1.0, 1.0)])
def test_vanilla_and_chunked_gae_equal_the_forward_sum_on_every_row(chunk_size, gamma, lambd):
    # T = 10 is no multiple of 3, 8 or 64 and shorter than 64: the zero-padded last chunk changes nothing; λ = 0 is
    # the w = γλ = 0 scan, whose chunk matrix is the identity
    rewards, values = random_tensor(5, (3, 10)), random_tensor(6, (3, 10))
    expected = [ref_gae(v, r, gamma, lambd) for v, r in zip(values.tolist(), rewards.tolist())]
    results = [vanilla_gae(rewards, values, gamma, lambd),
               chunked_gae(rewards, values, gamma, lambd, chunk_size=chunk_size)]
    for advantages, returns in results:
        torch.testing.assert_close(advantages, t([adv for adv, _ in expected]))
        torch.testing.assert_close(returns, t([ret for _, ret in expected]))


def test_gae_of_float32_inputs_is_the_float64_result_rounded_once():
    # the recursion runs in float64 and rounds once, so a float32 output is within one float32 ulp (2^-23
    # relative) of the float64 result on the same inputs, over a row long enough for float32 rounding to add up
    rewards, values = random_tensor(7, (4, 3000)).float(), random_tensor(8, (4, 3000)).float()
    exact_adv, exact_ret = vanilla_gae(rewards.double(), values.double(), 0.99, 0.95)
    for advantages, returns in (vanilla_gae(rewards, values, 0.99, 0.95), chunked_gae(rewards, values, 0.99, 0.95)):
        assert advantages.dtype == returns.dtype == torch.float32
        torch.testing.assert_close(advantages.double(), exact_adv, rtol=2**-23, atol=1e-12)
        torch.testing.assert_close(returns.double(), exact_ret, rtol=2**-23, atol=1e-12)


def test_policy_loss_and_kl_are_callable_eagerly_through_wrapped_as_upstreams_tests_call_them():
    # upstream compiles both with torch.compile and its tests call .__wrapped__; here both forms are the same function
    pg, clipfrac = compute_policy_loss.__wrapped__(t([-math.log(1.5)]), t([2.0]), eps_clip=0.2, eps_clip_high=0.2)
    torch.testing.assert_close(pg, t([-1.2 * 2.0]))  # ratio 1.5 clipped to 1.2
    torch.testing.assert_close(clipfrac, t([1.0]))
    kl = compute_approx_kl.__wrapped__(t([0.5]), t([0.0]), kl_loss_type="k2")
    torch.testing.assert_close(kl, t([0.125]))
    assert compute_policy_loss.__wrapped__.__name__ == "compute_policy_loss"


def test_grpo_returns_broadcast_each_reward_to_its_tokens():
    returns = get_grpo_returns(t([0.5, -1.0]), [t([0.0, 0.0]), t([0.3, 0.1, 0.2])])
    assert [r.tolist() for r in returns] == [[0.5, 0.5], [-1.0, -1.0, -1.0]]


def _reinforce_plus_plus(rewards, kl, masks, kl_coef, gamma):
    lengths = [k.numel() for k in kl]
    return get_reinforce_plus_plus_returns(rewards, kl, masks, lengths, lengths, kl_coef, gamma)


def test_reinforce_plus_plus_returns_hand_computed_and_loop():
    # kl_coef 1: token rewards 0.1, −0.2, 0 and the reward 1.0 on the last token
    (returns,) = _reinforce_plus_plus(t([1.0]), [t([-0.1, 0.2, 0.0])], [torch.ones(3)], 1.0, 0.5)
    torch.testing.assert_close(returns, t([0.1 + 0.5 * (-0.2 + 0.5), -0.2 + 0.5, 1.0]))
    kl = random_tensor(4, (11,))
    token_rewards = [-0.3 * k for k in kl.tolist()]
    token_rewards[-1] += 2.0
    expected = [sum(0.9**l * token_rewards[k + l] for l in range(11 - k)) for k in range(11)]
    (returns,) = _reinforce_plus_plus(t([2.0]), [kl], [torch.ones(11)], 0.3, 0.9)
    torch.testing.assert_close(returns, t(expected))


def _upstream_reinforce_plus_plus(reward, kl, mask, kl_coef, gamma):
    """Upstream's rule, written out: every token's −kl_coef·kl, the reward on the last trainable token, and the
    discounting across every token, masked ones included."""
    token_rewards = [-kl_coef * k for k in kl]
    token_rewards[max(i for i, m in enumerate(mask) if m)] += reward
    returns, running = [0.0] * len(kl), 0.0
    for i in reversed(range(len(kl))):
        running = token_rewards[i] + gamma * running
        returns[i] = running
    return returns


def test_reinforce_plus_plus_departure_masked_tokens_are_absent_not_discounted_across():
    # departures.toml [math."get_reinforce_plus_plus_returns"]: miles discounts over the trainable tokens only and
    # writes 0 at masked ones; upstream discounts across the masked tokens and shapes with their KL too
    kl, mask = [0.2, 0.4, -0.6, 0.1], [1, 0, 1, 0]
    (returns,) = _reinforce_plus_plus(t([1.0]), [t(kl)], [torch.tensor(mask)], 0.5, 0.9)
    kept_last = 0.3 + 1.0  # −0.5·(−0.6) plus the reward
    torch.testing.assert_close(returns, t([-0.1 + 0.9 * kept_last, 0.0, kept_last, 0.0]))
    upstream = _upstream_reinforce_plus_plus(1.0, kl, mask, 0.5, 0.9)
    torch.testing.assert_close(t(upstream), t([0.73655, 0.9295, 1.255, -0.05]))
    assert abs(upstream[0] - returns[0].item()) > 0.3  # the two rules really differ on this sample
    (fully_masked,) = _reinforce_plus_plus(t([1.0]), [t(kl)], [torch.zeros(4)], 0.5, 0.9)
    assert fully_masked.tolist() == [0.0] * 4  # upstream asserts on a fully masked sample


# ---------------------------------------------------------------- group normalization and whitening


def test_group_normalize_rewards_hand_computed():
    rewards = t([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    normalized = group_normalize_rewards(rewards, group_size=3)
    # group 1: mean 1/3, Bessel std sqrt(1/3); group 2: all equal → 0
    std = math.sqrt(1.0 / 3.0)
    expected = [(2 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), 0.0, 0.0, 0.0]
    torch.testing.assert_close(normalized, t(expected))
    torch.testing.assert_close(
        group_normalize_rewards(rewards, 3, std_normalization=False), t([2 / 3, -1 / 3, -1 / 3, 0, 0, 0])
    )
    torch.testing.assert_close(group_normalize_rewards(rewards, 1), torch.zeros(6, dtype=torch.float64))


@pytest.mark.parametrize("seed,group_size", [(0, 2), (1, 4), (2, 8)])
def test_group_normalize_rewards_matches_statistics_module(seed, group_size):
    rng = random.Random(seed)
    rewards = [rng.choice([0.0, 0.5, 1.0]) for _ in range(group_size * 3)]
    normalized = group_normalize_rewards(t(rewards), group_size)
    expected = []
    for g in range(3):
        group = rewards[g * group_size : (g + 1) * group_size]
        mean, std = statistics.mean(group), statistics.stdev(group)
        expected += [(r - mean) / (std + 1e-6) for r in group]
    torch.testing.assert_close(normalized, t(expected))


def test_group_normalize_rewards_rejects_a_size_that_does_not_divide():
    with pytest.raises(ValueError, match="groups of 4"):
        group_normalize_rewards(t([1.0] * 6), 4)


def test_normalize_advantages_masked_whitening():
    advantages = t([1.0, 100.0, 2.0, 3.0, NAN, 6.0])
    mask = torch.tensor([1, 0, 1, 1, 0, 1])
    whitened = normalize_advantages(advantages, mask)
    kept = [1.0, 2.0, 3.0, 6.0]
    mean, variance = statistics.mean(kept), statistics.variance(kept)
    expected = [(x - mean) / math.sqrt(variance + 1e-8) for x in kept]
    torch.testing.assert_close(whitened, t([expected[0], 0.0, expected[1], expected[2], 0.0, expected[3]]))


def test_normalize_advantages_departure_masked_positions_get_zero_not_the_whitened_value():
    # departures.toml [math."normalize_advantages"]: the statistics are the masked ones in both; upstream then
    # whitens every position, miles writes 0 at the masked ones (they never reach a loss either way)
    advantages, mask = t([1.0, 100.0, 3.0]), torch.tensor([1, 0, 1])
    scale = 1.0 / math.sqrt(2.0 + 1e-8)  # kept 1 and 3: mean 2, Bessel variance 2
    upstream = [(a - 2.0) * scale for a in advantages.tolist()]
    torch.testing.assert_close(normalize_advantages(advantages, mask), t([upstream[0], 0.0, upstream[2]]))
    assert upstream[1] == pytest.approx(98.0 * scale)


def test_normalize_advantages_edge_cases():
    torch.testing.assert_close(normalize_advantages(t([5.0, 7.0]), torch.tensor([1, 0])), t([0.0, 0.0]))
    with pytest.raises(ValueError, match="no unmasked token"):
        normalize_advantages(t([1.0]), torch.tensor([0]))


# ---------------------------------------------------------------- GSPO, ESS and the reductions


def _gspo_kl(ppo_kl_rows, mask_rows):
    """compute_gspo_kl on rows of old − lp (lp = 0), in upstream's list form."""
    old = [t(row) for row in ppo_kl_rows]
    zeros = [torch.zeros_like(o) for o in old]
    return compute_gspo_kl(zeros, old, zeros, [torch.tensor(m) for m in mask_rows])


def test_gspo_kl_is_the_masked_sequence_mean_broadcast():
    ppo_kl = [[0.1, 0.3, NAN, 9.0], [INF, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0], [1.0, 2.0]]
    mask = [[1, 1, 0, 0], [0, 1, 1, 1], [0, 0, 0, 0], [1, 1]]
    torch.testing.assert_close(_gspo_kl(ppo_kl, mask), t([0.2] * 4 + [2.0] * 4 + [0.0] * 4 + [1.5] * 2))


def test_gspo_kl_gradient_spreads_over_the_unmasked_tokens():
    log_probs = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    compute_gspo_kl([log_probs], [t([0.0] * 4)], [log_probs], [torch.tensor([1, 1, 0, 1])])[0].backward()
    torch.testing.assert_close(log_probs.grad, t([-1 / 3, -1 / 3, 0.0, -1 / 3]))


def test_ess_ratio_hand_computed_and_loop():
    log_ratio = t([[0.0, 0.0, 5.0], [0.0, math.log(3.0), INF], [1.0, 2.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [0, 0, 0]])
    ess = compute_ess_ratio(log_ratio, mask)
    torch.testing.assert_close(ess, t([1.0, 16.0 / 20.0, 0.0]))  # (1+3)² / (2·(1+9)) = 0.8; fully masked → 0
    for seed in range(3):
        lr, m = random_tensor(seed, (9,)), torch.tensor([1, 1, 0, 1, 1, 1, 0, 1, 1])
        w = [math.exp(x) for x, keep in zip(lr.tolist(), m.tolist()) if keep]
        assert compute_ess_ratio(lr, m).item() == pytest.approx(sum(w) ** 2 / (len(w) * sum(x * x for x in w)))


def test_ess_ratio_stays_finite_for_extreme_log_ratios():
    ess = compute_ess_ratio(t([[50.0, -50.0, 0.0], [INF, 0.0, 0.0], [-INF, -INF, -INF]], torch.float32),
                            torch.ones(3, 3))
    assert torch.isfinite(ess).all()
    torch.testing.assert_close(ess, t([1 / 3, 1 / 3, 1.0], torch.float32), atol=1e-6, rtol=1e-5)


def test_ess_ratio_departure_log_weights_are_shifted_not_clamped():
    # departures.toml [math."compute_ess_ratio"]: upstream clamps each log-weight to ±20 before the exponential, so
    # weights beyond e^20 all look equal; miles shifts by the maximum (ESS is scale invariant) and keeps them apart
    log_ratio = t([[25.0, 30.0]])
    upstream_weights = [math.exp(min(x, 20.0)) for x in (25.0, 30.0)]
    upstream = sum(upstream_weights) ** 2 / (2 * sum(w * w for w in upstream_weights))
    weights = [math.exp(-5.0), 1.0]
    miles = sum(weights) ** 2 / (2 * sum(w * w for w in weights))
    assert upstream == pytest.approx(1.0) and miles == pytest.approx(0.50674, abs=1e-5)
    torch.testing.assert_close(compute_ess_ratio(log_ratio, torch.ones(1, 2)), t([miles]))


def test_opsm_mask_with_upstreams_signature_hand_computed():
    # sample 0: κ = (0.02 + 0 + 0.01) / 3 = 0.01 > δ, A < 0 on its first two tokens: they are dropped;
    # sample 1: κ = 0 (old = current): nothing dropped, whatever its advantages
    args = types.SimpleNamespace(opsm_delta=1e-4)
    mask, clipfrac = compute_opsm_mask(
        args, [t([-1.02, -1.0, -1.01]), t([-0.5, -0.5])], [t([-1.0, -1.0, -1.0]), t([-0.5, -0.5])],
        [t([-1.0, -1.0, 2.0]), t([-1.0, -1.0])], [torch.ones(3), torch.ones(2)],
    )
    assert mask.tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert clipfrac.item() == pytest.approx(2 / 3)


def test_sum_of_sample_mean_hand_computed_with_a_fully_masked_sample():
    values = [t([1.0, 3.0, 100.0]), t([NAN, INF]), t([2.0])]
    masks = [torch.tensor([1, 1, 0]), torch.tensor([0, 0]), torch.tensor([1])]
    # sample means 2.0, 0 (fully masked), 2.0 → mean over 3 samples
    assert sum_of_sample_mean(values, masks).item() == pytest.approx(4.0 / 3.0)
    assert sum_of_sample_mean(values, masks, divisor=8).item() == pytest.approx(4.0 / 8.0)
    # token sum: (1 + 3 + 2) over 3 unmasked tokens, or over a given divisor
    assert sum_of_token(values, masks).item() == pytest.approx(2.0)
    assert sum_of_token(values, masks, divisor=12).item() == pytest.approx(0.5)
    assert sum_of_token([t([5.0])], [torch.tensor([0])]).item() == 0.0


def test_reductions_accept_padded_tensors_and_reject_mismatched_lists():
    values, masks = t([[1.0, 3.0], [2.0, 0.0]]), torch.tensor([[1, 1], [1, 0]])
    assert sum_of_sample_mean(values, masks).item() == pytest.approx(2.0)
    assert sum_of_token(values, masks).item() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="pair up"):
        sum_of_sample_mean([t([1.0, 2.0])], [torch.tensor([1])])


def test_sum_of_sample_mean_gradient_weights_each_token_by_its_sample():
    values = [t([1.0, 2.0]).requires_grad_(True), t([3.0, 4.0, 5.0, 6.0]).requires_grad_(True)]
    sum_of_sample_mean(values, [torch.ones(2), torch.tensor([1, 1, 1, 0])]).backward()
    torch.testing.assert_close(values[0].grad, t([0.25, 0.25]))
    torch.testing.assert_close(values[1].grad, t([1 / 6, 1 / 6, 1 / 6, 0.0]))
