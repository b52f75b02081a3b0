"""The trainer's batched forward passes against per-sample references written here: one unpadded forward per
sample, the log-prob of response token t read by hand at the position that predicts it (prompt_len + t − 1)."""

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

from miles.backends.torch_backend.models import (
    pad_right,
    response_log_probs,
    response_values,
)
from miles.models.hf import load_value_model
from miles.utils.types import Sample

VOCAB_SIZE = 11


def _config() -> Qwen2Config:
    return Qwen2Config(vocab_size=VOCAB_SIZE, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                       tie_word_embeddings=False, num_labels=1)


@pytest.fixture(scope="module")
def policy() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(_config()).eval()


def _sample(prompt: list[int], response: list[int], index: int = 0) -> Sample:
    return Sample(group_index=index, index=index, prompt="", label="", tokens=prompt + response,
                  response_length=len(response))


# Token ids below the embedded default's 15.
SAMPLES_IN_VOCAB = [_sample([1, 4, 7], [3, 2], 0), _sample([1], [4, 5, 6, 2], 1)]

# Prompt lengths 3, 5, 1, response lengths 2, 1, 6, total lengths 5, 6, 7: every padded row has its own layout.
SAMPLES = [
    _sample([1, 4, 7], [3, 2], 0),
    _sample([1, 5, 6, 8, 10], [2], 1),
    _sample([1], [4, 5, 6, 7, 8, 2], 2),
]


def _unpadded_log_softmax(model, sample: Sample, temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([sample.tokens])).logits[0]  # (T, V)
    return torch.log_softmax(logits.double() / temperature, dim=-1)  # (T, V)


def _reference_log_probs_and_entropies(model, sample: Sample, temperature: float) -> tuple[list[float], list[float]]:
    log_softmax = _unpadded_log_softmax(model, sample, temperature)
    log_probs, entropies = [], []
    for t in range(sample.response_length):
        position = sample.prompt_length + t - 1  # the position whose logits predict response token t
        token = sample.tokens[sample.prompt_length + t]
        log_probs.append(float(log_softmax[position, token]))
        probs = [float(value) for value in log_softmax[position].exp()]
        entropies.append(-sum(p * math.log(p) for p in probs))
    return log_probs, entropies


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
def test_log_probs_and_entropies_match_an_unpadded_forward_per_sample(policy, temperature):
    log_probs, entropies = response_log_probs(policy, SAMPLES, temperature, with_entropy=True)
    assert [len(lp) for lp in log_probs] == [len(e) for e in entropies] == [2, 1, 6]
    for sample, lp, entropy in zip(SAMPLES, log_probs, entropies, strict=True):
        expected_lp, expected_entropy = _reference_log_probs_and_entropies(policy, sample, temperature)
        assert lp.tolist() == pytest.approx(expected_lp, abs=1e-5)
        assert entropy.tolist() == pytest.approx(expected_entropy, abs=1e-5)


def test_temperature_is_applied_to_the_log_probs(policy):
    """A sanity bound for the test above: temperature changes the values by far more than the tolerance."""
    with torch.no_grad():
        at_one, _ = response_log_probs(policy, SAMPLES, 1.0)
        at_half, _ = response_log_probs(policy, SAMPLES, 0.5)
    assert max(float((a - b).abs().max()) for a, b in zip(at_one, at_half)) > 1e-3


def test_entropies_are_off_by_default_and_log_probs_carry_gradients(policy):
    log_probs, entropies = response_log_probs(policy, SAMPLES, 1.0)
    assert entropies is None
    assert all(lp.requires_grad and lp.dtype == torch.float32 for lp in log_probs)


class _PositionScores(torch.nn.Module):
    """A stand-in critic whose score at (row, position) is position + 100·token, known without a forward pass."""

    def forward(self, input_ids, attention_mask):
        positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)  # (B, T)
        return SimpleNamespace(logits=(positions + 100 * input_ids).double().unsqueeze(-1))  # (B, T, 1)


def test_values_are_read_at_the_position_before_each_response_token():
    values = response_values(_PositionScores(), SAMPLES)
    for sample, value in zip(SAMPLES, values, strict=True):
        positions = range(sample.prompt_length - 1, len(sample.tokens) - 1)
        assert value.tolist() == [p + 100 * sample.tokens[p] for p in positions]
        assert value.dtype == torch.float32


def test_values_of_a_real_critic_match_an_unpadded_forward():
    torch.manual_seed(1)
    critic = Qwen2ForTokenClassification(_config()).eval()
    with torch.no_grad():
        values = response_values(critic, SAMPLES)
    for sample, value in zip(SAMPLES, values, strict=True):
        with torch.no_grad():
            scores = critic(input_ids=torch.tensor([sample.tokens])).logits[0, :, 0]  # (T,)
        expected = [float(scores[sample.prompt_length + t - 1]) for t in range(sample.response_length)]
        assert value.tolist() == pytest.approx(expected, abs=1e-5)


def test_pad_right_shapes_and_masks():
    input_ids, attention_mask = pad_right(SAMPLES, pad_token_id=9)
    assert input_ids.shape == attention_mask.shape == (3, 7)
    assert input_ids.dtype == attention_mask.dtype == torch.long
    assert input_ids.tolist() == [
        [1, 4, 7, 3, 2, 9, 9],
        [1, 5, 6, 8, 10, 2, 9],
        [1, 4, 5, 6, 7, 8, 2],
    ]
    assert attention_mask.tolist() == [
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 1, 1],
    ]
    _, short_mask = pad_right([_sample([1], [2]), _sample([1, 2, 3], [4])])
    assert short_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]


def test_the_critic_trains_without_dropout(embedded):
    """Its targets and old values are computed in eval mode; a train-mode pass must give the same values."""
    critic = load_value_model(embedded.checkpoint_dir).train()
    assert critic.config.classifier_dropout == 0.0
    with torch.no_grad():
        first, second = response_values(critic, SAMPLES_IN_VOCAB), response_values(critic, SAMPLES_IN_VOCAB)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
