"""Dynamic sampling (--over-sampling-batch-size, --dynamic-sampling-filter-path): upstream's filter on hand-made
groups, the round loop and the rollout manager with a stand-in engine, the prompt positions a checkpoint saves, and
the guard on the samples the loop keeps. Every expected value is counted by hand in the comments."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from miles.guard import off_policy
from miles.ray.rollout_manager import RolloutManager
from miles.rollout.data_source import PromptDataSource
from miles.rollout.dynamic_sampling import filter_verdict, load_dynamic_filter, sample_dynamically
from miles.rollout.filter_hub.base_types import DynamicFilterOutput, call_dynamic_filter
from miles.rollout.filter_hub.dynamic_sampling_filters import check_reward_nonzero_std, reward_std
from miles.utils.errors import MilesConfigError, MilesRunError, OffPolicyGuardError
from miles.utils.types import Sample

UPSTREAM_PATH = "miles.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"


def group(rewards, prompt="p", version=0):
    return [Sample(group_index=0, index=i, prompt=prompt, label="", tokens=[1, 2], response_length=1, reward=r,
                   weight_versions=[version], weight_fingerprint=f"fp{version}") for i, r in enumerate(rewards)]


def test_upstream_filter_on_hand_made_groups():
    assert check_reward_nonzero_std(None, group([1.0, 0.0, 1.0, 1.0])) == DynamicFilterOutput(True, None)
    assert check_reward_nonzero_std(None, group([1.0] * 4)) == DynamicFilterOutput(False, "zero_std_1.0")
    assert check_reward_nonzero_std(None, group([0.0] * 4)) == DynamicFilterOutput(False, "zero_std_0.0")
    assert check_reward_nonzero_std(None, group([0.26, 0.26])) == DynamicFilterOutput(False, "zero_std_0.3")
    # std of [0, 1e-9]: 1e-9 / sqrt(2) = 7.1e-10 <= 1e-8, dropped; of [0, 1e-7]: 7.1e-8 > 1e-8, kept
    assert not check_reward_nonzero_std(None, group([0.0, 1e-9])).keep
    assert check_reward_nonzero_std(None, group([0.0, 1e-7])).keep
    assert not check_reward_nonzero_std(None, group([1.0])).keep  # torch.std of one value is NaN: never kept
    # unbiased: [0, 1, 1, 1] has mean 3/4, squares 9/16 + 3/16 = 12/16, / 3 = 1/4, std 1/2
    assert reward_std([0.0, 1.0, 1.0, 1.0]) == 0.5 and math.isnan(reward_std([2.0]))


def test_upstream_path_loads_and_legacy_bool_filters_are_accepted():
    assert load_dynamic_filter(UPSTREAM_PATH) is check_reward_nonzero_std
    assert load_dynamic_filter(None) is None
    assert call_dynamic_filter(None, None, group([1.0])) == DynamicFilterOutput(True)
    assert call_dynamic_filter(lambda args, samples: False, None, group([1.0])) == DynamicFilterOutput(False, None)
    with pytest.raises(MilesConfigError, match="--dynamic-sampling-filter-path is 'miles.nope.f'"):
        load_dynamic_filter("miles.nope.f")


def stand_in(rewards_of_prompt, n=2):
    """generate(prompts, round): group of prompt i has n copies of rewards_of_prompt[i]'s pattern."""
    calls = []

    def generate(prompts, round_index):
        calls.append((list(prompts), round_index))
        return [group(rewards_of_prompt[p], prompt=str(p)) for p in prompts]
    return generate, calls


def drawer():
    position = [0]

    def draw(count):
        position[0] += count
        return list(range(position[0] - count, position[0]))
    return draw


def test_loop_keeps_passing_groups_in_prompt_order_over_rounds():
    # prompts 0..11; spread (kept) only for prompts 1, 4, 5, 9, 10; the others all 1.0 (even) or all 0.0 (odd)
    spread = {1, 4, 5, 9, 10}
    rewards = {p: [1.0, 0.0] if p in spread else [float(p % 2 == 0)] * 2 for p in range(12)}
    generate, calls = stand_in(rewards)
    result = sample_dynamically(7, target=4, over_sampling_batch_size=4, num_prompts=12, draw=drawer(),
                                generate=generate, keep=filter_verdict(check_reward_nonzero_std, None),
                                filter_name=UPSTREAM_PATH)
    # round 0 draws 0-3: keeps 1 (drops 0 even, 2 even, 3 odd); round 1 draws 4-7: keeps 4, 5 (drops 6, 7);
    # round 2 draws 8-11: keeps 9 (the 4th), 10 passes but B is full: dropped without a reason; drops 8, 11
    assert [g[0].prompt for g in result.groups] == ["1", "4", "5", "9"]
    assert [c[1] for c in calls] == [0, 1, 2] and (result.rounds, result.prompts_drawn) == (3, 12)
    metrics = result.metrics()
    assert metrics["rollout/dynamic_filter/drop_zero_std_1.0"] == 4.0  # prompts 0, 2, 6, 8
    assert metrics["rollout/dynamic_filter/drop_zero_std_0.0"] == 3.0  # prompts 3, 7, 11
    assert metrics["rollout/dynamic_filter/rounds"] == 3.0
    # every generated reward: 5 spread groups give 5 ones, prompts 0, 2, 6, 8 give 8 ones: 13 ones of 24
    assert metrics["rollout/raw_reward_unfiltered"] == 13 / 24


def test_no_filter_takes_the_first_groups_of_one_round():
    generate, calls = stand_in({p: [1.0, 1.0] for p in range(6)})
    result = sample_dynamically(0, target=2, over_sampling_batch_size=3, num_prompts=6, draw=drawer(),
                                generate=generate, keep=filter_verdict(None, None), filter_name=None)
    assert [g[0].prompt for g in result.groups] == ["0", "1"] and len(calls) == 1 and result.prompts_drawn == 3


def test_a_filter_that_keeps_too_little_stops_with_the_counts():
    generate, calls = stand_in({p: [1.0, 1.0] for p in range(100)})
    with pytest.raises(MilesRunError, match=r"rollout 3: 3 rounds drew 9 prompts .* only 0 of the "
                                            r"--rollout-batch-size 2 groups .*'zero_std_1.0': 9"):
        # give up after 6 prompts + one round of 3 = 9: three rounds, nine groups dropped
        sample_dynamically(3, target=2, over_sampling_batch_size=3, num_prompts=6, draw=drawer(),
                           generate=generate, keep=filter_verdict(check_reward_nonzero_std, None),
                           filter_name=UPSTREAM_PATH)


def test_prompt_positions_follow_what_each_rollout_drew_and_resume_exactly():
    prompts = [{"prompt": str(i), "label": ""} for i in range(10)]
    source = PromptDataSource(prompts, rollout_batch_size=2, shuffle=True, seed=5)
    drawn = {}
    for rollout_id, rounds in [(0, 1), (1, 3), (2, 2)]:  # rounds of 3 prompts each
        drawn[rollout_id] = [p for _ in range(rounds) for p in source.draw(rollout_id, 3)]
        source.finish(rollout_id)
    # positions: rollout 0 at 0, rollout 1 at 3, rollout 2 at 3 + 9 = 12, rollout 3 at 12 + 6 = 18
    assert [source.position(k) for k in (1, 2, 3)] == [3, 12, 18]
    resumed = PromptDataSource(prompts, rollout_batch_size=2, shuffle=True, seed=5)
    resumed.continue_at(2, source.position(2))  # what a checkpoint after rollout 1 saved
    assert resumed.draw(2, 3) + resumed.draw(2, 3) == drawn[2]
    # an unbroken stream: rollout 1's 9 prompts are positions 3..11 of the same shuffled epochs
    assert drawn[0] + drawn[1] + drawn[2] == PromptDataSource(prompts, 18, True, 5).draw(0, 18)


def make_manager(rewards_of_prompt, version_of_round, over=3, batch=2, n=2):
    """A RolloutManager whose engines are a stand-in: prompt i's group has rewards_of_prompt[i], stamped with the
    weight version of its round."""
    args = SimpleNamespace(rollout_batch_size=batch, over_sampling_batch_size=over, n_samples_per_prompt=n,
                           dynamic_sampling_filter_path=UPSTREAM_PATH, save_debug_rollout_data=None,
                           rollout_temperature=1.0, rollout_max_response_len=4, rollout_top_p=1.0, rollout_top_k=-1,
                           rollout_min_p=0.0, rollout_stop=None, rollout_stop_token_ids=None, sampling_logprobs=None)
    manager = object.__new__(RolloutManager)
    prompts = [{"prompt": str(i), "label": ""} for i in range(len(rewards_of_prompt))]
    manager.args, manager.weight_version, manager.last_push_s, manager.push_perf = args, 0, 0.0, {}
    manager.data_source = PromptDataSource(prompts, batch, shuffle=False, seed=0)
    manager.dynamic_filter = load_dynamic_filter(UPSTREAM_PATH)

    def _sample(prompts, n_samples, rollout_id, seed_offset, temperature, max_response_len, sampling, round_index=0):
        version = version_of_round[round_index]
        return [s for p in prompts for s in group(rewards_of_prompt[int(p["prompt"])], p["prompt"], version)]
    manager._sample = _sample
    return manager


def test_manager_renumbers_kept_groups_and_reports_the_filter():
    rewards = [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 0.0], [1.0, 0.0]]
    manager = make_manager(rewards, version_of_round={0: 4, 1: 4})
    batch, metrics = manager.generate(0)
    # round 0 (prompts 0-2) keeps 1; round 1 (prompts 3-5) keeps 5: two rounds, six prompts drawn
    assert [s.prompt for s in batch.samples] == ["1", "1", "5", "5"]
    assert [(s.index, s.group_index) for s in batch.samples] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert metrics["rollout/dynamic_filter/drop_zero_std_1.0"] == 2.0  # prompts 0, 4
    assert metrics["rollout/dynamic_filter/drop_zero_std_0.0"] == 2.0  # prompts 2, 3
    assert metrics["rollout/num_samples"] == 4.0 and metrics["rollout/dynamic_filter/rounds"] == 2.0
    assert manager.prompt_position(1) == 6  # the checkpoint's position: the next rollout starts after the 6 drawn


def guard_provenance(rollout_id, samples, version_to_rollouts_trained, pushed, expected):
    """The guard's per-sample checks, in train_process._check_provenance's order."""
    versions = off_policy.check_one_version_per_sample(rollout_id, [s.weight_versions for s in samples])
    staleness = off_policy.sample_staleness(rollout_id, versions, version_to_rollouts_trained)
    off_policy.check_staleness(rollout_id, staleness, expected, max_weight_staleness=None)
    off_policy.check_engine_loaded_pushed_weights(rollout_id, versions, [s.weight_fingerprint for s in samples], pushed)
    return staleness


def test_guard_reads_each_kept_sample_own_version():
    rewards = [[0.0, 1.0]] * 2 + [[1.0, 1.0]] + [[0.0, 1.0]] * 3
    trained, pushed = {0: 0, 1: 1}, {0: "fp0", 1: "fp1"}  # version v pushed after v rollouts
    # every round with version 1: rollout 1 is 0 stale, as the schedule (expected 0) says: accepted
    same, _ = make_manager(rewards, {0: 1, 1: 1}, over=2, batch=3).generate(1)
    assert guard_provenance(1, same.samples, trained, pushed, expected=0) == [0] * 6
    # were a push to land between rounds, the batch would mix versions 0 and 1: the guard finds the samples of
    # version 0 one rollout stale, against the schedule, and refuses (miles' loop runs every round in one call)
    mixed, _ = make_manager(rewards, {0: 0, 1: 1}, over=2, batch=3).generate(1)
    assert sorted({s.weight_versions[0] for s in mixed.samples}) == [0, 1]
    with pytest.raises(OffPolicyGuardError, match=r"rollout 1: samples are \[1\] rollout\(s\) stale"):
        guard_provenance(1, mixed.samples, trained, pushed, expected=0)


def test_guard_catches_a_mislabelled_kept_sample():
    rewards = [[0.0, 1.0]] * 4
    batch, _ = make_manager(rewards, {0: 1}, over=2, batch=2).generate(0)
    batch.samples[3].weight_fingerprint = "fp0"  # labelled version 1, generated with version 0's weights
    with pytest.raises(OffPolicyGuardError, match="sample 3: the engine stamped weight version 1 with fingerprint"):
        guard_provenance(0, batch.samples, {0: 0, 1: 0}, {0: "fp0", 1: "fp1"}, expected=0)


@pytest.mark.parametrize(("over", "fails"), [(None, False), (16, False), (32, False), (15, True)])
def test_over_sampling_batch_size_defaults_to_and_is_at_least_the_rollout_batch_size(over, fails):
    from miles.config.arguments import parse_args

    argv = ["--rollout-batch-size", "16"] + ([] if over is None else ["--over-sampling-batch-size", str(over)])
    if fails:
        with pytest.raises(MilesConfigError, match="--over-sampling-batch-size 15 is below --rollout-batch-size 16"):
            parse_args(argv=argv)
    else:
        assert parse_args(argv=argv).over_sampling_batch_size == (over or 16)
