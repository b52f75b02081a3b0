"""Micro-batches by token budget and the balanced DP partition: hand-computed cases and the properties the step
loop relies on (every sample exactly once; a micro-batch within its padded budget unless one sample exceeds it)."""

import random

import pytest

from miles.backends.training_utils.micro_batches import (
    balanced_order,
    balanced_partition,
    fixed_micro_batches,
    padded_tokens,
    token_budget_micro_batches,
)


def test_padded_tokens_is_count_times_longest():
    assert padded_tokens([0, 2], [5, 100, 7]) == 2 * 7


def test_fixed_micro_batches_are_consecutive_runs():
    assert fixed_micro_batches([4, 5, 6, 7, 8], 2) == [[4, 5], [6, 7], [8]]


def test_token_budget_by_hand():
    lengths = [100, 200, 300, 50, 60]
    # longest first: 2 (300) opens [2]; 1 (200): 2 x 300 > 400, opens [1]; 0 (100): [2] would be 600, [1] 2 x 200
    # = 400 fits; 4 (60): [2] 600, [1] 3 x 200 = 600, opens [4]; 3 (50): [2], [1] no, [4] 2 x 60 = 120 fits.
    assert token_budget_micro_batches(range(5), lengths, 400) == [[2], [0, 1], [3, 4]]
    # upstream's help example: 100, 200, 300 at 300 tokens; padded, [100, 200] is 400 tokens, so three passes
    assert token_budget_micro_batches(range(3), [100, 200, 300], 300) == [[2], [1], [0]]
    assert token_budget_micro_batches(range(3), [100, 200, 300], 600) == [[1, 2], [0]]
    assert token_budget_micro_batches(range(3), [100, 200, 300], 900) == [[0, 1, 2]]


def test_a_sample_over_the_budget_is_a_micro_batch_of_its_own():
    assert token_budget_micro_batches([7, 8, 9], {7: 10, 8: 500, 9: 10}, 100) == [[8], [7, 9]]


@pytest.mark.parametrize("seed", range(20))
def test_token_budget_properties(seed):
    rng = random.Random(seed)
    indices = rng.sample(range(100), rng.randint(1, 40))
    lengths = {i: rng.randint(1, 64) for i in indices}
    budget = rng.randint(16, 256)
    micro_batches = token_budget_micro_batches(indices, lengths, budget)
    assert sorted(i for mb in micro_batches for i in mb) == sorted(indices)  # every sample exactly once
    for mb in micro_batches:
        assert mb == sorted(mb)
        assert padded_tokens(mb, lengths) <= budget or len(mb) == 1
    # first fit never leaves two single samples apart that fit together
    singles = [mb[0] for mb in micro_batches if len(mb) == 1 and lengths[mb[0]] * 2 <= budget]
    assert len(singles) <= 1


def test_balanced_partition_by_hand():
    lengths = [10, 1, 1, 10, 5, 5]
    # 0 (10) -> p0; 3 (10) -> p1; 4 (5) -> p0 (10 vs 10: lowest); 5 (5) -> p1; 1 (1) -> p0 (15 vs 15); 2 -> p1
    assert balanced_partition(range(6), lengths, 2) == [[0, 1, 4], [2, 3, 5]]
    # a skewed step: contiguous halves hold 30 and 3 tokens. 0 -> p0, 1 -> p1, 2 -> p0 (tie), 3, 4 -> p1 (11 < 20,
    # 12 < 20), p1 is full, 5 -> p0: 21 and 12 (equal sizes bind: 3 samples each)
    lengths = [10, 10, 10, 1, 1, 1]
    parts = balanced_partition(range(6), lengths, 2)
    assert parts == [[0, 2, 5], [1, 3, 4]]
    assert [sum(lengths[i] for i in part) for part in parts] == [21, 12]
    assert balanced_order(range(6), lengths, 2) == [0, 2, 5, 1, 3, 4]


def test_balanced_partition_better_than_contiguous_on_sorted_lengths():
    lengths = list(range(1, 9))  # contiguous halves: 10 and 26
    parts = balanced_partition(range(8), lengths, 2)
    sums = [sum(lengths[i] for i in part) for part in parts]
    assert sorted(sums) == [18, 18] and [len(part) for part in parts] == [4, 4]


@pytest.mark.parametrize("seed", range(10))
def test_balanced_partition_properties(seed):
    rng = random.Random(seed)
    parts_n = rng.randint(1, 4)
    indices = list(range(parts_n * rng.randint(1, 8)))
    lengths = [rng.randint(1, 100) for _ in indices]
    parts = balanced_partition(indices, lengths, parts_n)
    assert sorted(i for part in parts for i in part) == indices
    assert {len(part) for part in parts} == {len(indices) // parts_n}


def test_balanced_partition_refuses_unequal_shares():
    with pytest.raises(ValueError, match="5 samples cannot be split into 2 equal parts"):
        balanced_partition(range(5), [1] * 5, 2)
