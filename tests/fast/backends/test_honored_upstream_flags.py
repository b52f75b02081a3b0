"""Upstream's --log-probs-chunk-size and --deterministic-mode, honored: chunked log-probs are the whole response's,
a rollout trains to the same metrics with them, and deterministic mode is on in the train process and repeats a
run exactly (docs/conformance.md, "Accepted upstream flags")."""

import pytest
import torch

from miles.backends.training_utils.responses import gather_response_log_probs
from miles.utils.types import Sample
from tests.fast.trainers import metrics_of_one_trained_rollout

VOCAB = 11


def _sample(prompt_length: int, response_length: int, kept=None) -> Sample:
    tokens = [(3 * i + 1) % VOCAB for i in range(prompt_length + response_length)]
    sample = Sample(group_index=0, index=0, prompt="", label="", tokens=tokens, response_length=response_length)
    sample.sampling_kept_ids = kept  # prompt_length follows: len(tokens) - response_length
    return sample


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 5, 64])
def test_chunked_log_probs_and_entropies_are_the_whole_responses(chunk_size):
    # one plain sample, one scored under a truncated sampler's kept sets (each position's own: sliced per chunk)
    kept = [[t, (t + 1) % VOCAB, (t + 5) % VOCAB] for t in [(3 * i + 1) % VOCAB for i in range(3, 8)]]
    samples = [_sample(2, 6), _sample(3, 5, kept)]
    input_ids = torch.tensor([s.tokens + [0] * (8 - len(s.tokens)) for s in samples])
    logits = torch.randn(2, 8, VOCAB, generator=torch.Generator().manual_seed(chunk_size))
    whole = gather_response_log_probs(logits, input_ids, samples, 0.7, with_entropy=True)
    chunked = gather_response_log_probs(logits, input_ids, samples, 0.7, with_entropy=True, chunk_size=chunk_size)
    for expected, got in zip([*whole[0], *whole[1]], [*chunked[0], *chunked[1]], strict=True):
        # the same row-wise log-softmax per token, only the batching of rows differs: a few float32 ulps (max, exp,
        # sum, log) of values below 10 in magnitude
        torch.testing.assert_close(got, expected, rtol=0, atol=8 * torch.finfo(torch.float32).eps * 10)
    assert all(torch.isfinite(lp).all() for lp in chunked[0]) and chunked[0][1].shape == (5,)


@pytest.mark.usefixtures("restore_torch_threads")
def test_a_rollout_trains_to_the_same_metrics_with_log_probs_in_chunks(embedded):
    plain = metrics_of_one_trained_rollout(embedded)
    chunked = metrics_of_one_trained_rollout(embedded, "--log-probs-chunk-size", "2")
    assert chunked.keys() == plain.keys()
    for name, value in plain.items():  # float32 rounding of the chunks' batching, through one optimizer step
        if name != "pushed fingerprint":  # the weights after the step differ by that rounding, so their hash does
            assert chunked[name] == (value if isinstance(value, str) else pytest.approx(value, rel=1e-5, abs=1e-7)), name


@pytest.fixture
def restore_deterministic_algorithms():
    before = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(before)


@pytest.mark.usefixtures("restore_torch_threads", "restore_deterministic_algorithms")
def test_deterministic_mode_is_on_in_the_train_process_and_repeats_a_run_exactly(embedded):
    torch.use_deterministic_algorithms(False)
    first = metrics_of_one_trained_rollout(embedded, "--deterministic-mode")
    assert torch.are_deterministic_algorithms_enabled()
    assert metrics_of_one_trained_rollout(embedded, "--deterministic-mode") == first
