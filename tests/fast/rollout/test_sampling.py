"""Truncated sampling: the kept set (hand-computed cases), the behavior log-probs of the renormalized distribution
(against a direct top-k computation from a full forward pass), the trainer's recompute under the engine's kept set,
stops, and the default path left as it was. References are computed here with plain torch, not with the code under
test."""

import json
import math
import shutil

import pytest
import torch

from miles.backends.torch_backend.models import response_log_probs
from miles.rollout.engine import TorchRolloutEngine
from miles.rollout.sampling import kept_ids_per_row, kept_mask, kept_tokens, renormalized_log_probs
from miles.utils.errors import MilesConfigError
from miles.utils.types import SampleStatus

from tests.fast.rollout.test_engine import EOS, MIXED_PROMPTS, _full_forward_log_probs, _train_prompts

PROBS = torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]])  # one row, already sorted


@pytest.mark.parametrize(("top_p", "top_k", "min_p", "kept"), [
    (1.0, -1, 0.0, [0, 1, 2, 3, 4]),
    (0.6, -1, 0.0, [0, 1]),  # mass before token 1 is 0.5 <= 0.6; before token 2 it is 0.7
    (0.75, -1, 0.0, [0, 1, 2]),  # mass before token 2 is 0.7 <= 0.75: the token that crosses top-p is kept
    (0.3, -1, 0.0, [0]),  # the most likely token is always kept
    (1.0, 3, 0.0, [0, 1, 2]),
    (1.0, 0, 0.0, [0, 1, 2, 3, 4]),  # top-k 0 is off, as -1
    (1.0, -1, 0.25, [0, 1, 2]),  # p >= 0.25 * 0.5
    (0.8, 2, 0.0, [0, 1]),
])
def test_kept_set_follows_the_rule(top_p, top_k, min_p, kept):
    shuffled = torch.tensor([3, 0, 4, 1, 2])  # token id of each column: the rule must not depend on column order
    log_probs = torch.empty(1, 5).scatter(1, shuffled.unsqueeze(0), PROBS.log())
    mask = kept_tokens(log_probs, top_p, top_k, min_p)
    assert sorted(mask.nonzero()[:, 1].tolist()) == sorted(shuffled[kept].tolist())


def test_renormalized_log_probs_are_those_of_the_kept_mass():
    kept = torch.tensor([[True, True, False, False, False]])
    renormalized = renormalized_log_probs(PROBS.log(), kept)
    assert renormalized[0, :2].tolist() == pytest.approx([math.log(0.5 / 0.7), math.log(0.2 / 0.7)], abs=1e-6)
    assert torch.isneginf(renormalized[0, 2:]).all()


def test_kept_ids_round_trip_through_the_mask():
    mask = torch.tensor([[True, False, True], [False, False, True], [True, True, True]])
    ids = kept_ids_per_row(mask)
    assert ids == [[0, 2], [2], [0, 1, 2]]
    assert torch.equal(kept_mask(ids, 3), mask)


def _top_k_reference(model, samples, temperature, k):
    """Direct computation: at each response position, log_softmax over the k largest logits / T only."""
    width = max(len(s.tokens) for s in samples)
    input_ids = torch.zeros((len(samples), width), dtype=torch.long)
    for i, sample in enumerate(samples):
        input_ids[i, : len(sample.tokens)] = torch.tensor(sample.tokens)
    attention_mask = (torch.arange(width) < torch.tensor([len(s.tokens) for s in samples]).unsqueeze(1)).long()
    with torch.no_grad():
        scaled = model(input_ids=input_ids, attention_mask=attention_mask).logits / temperature  # (B, T, V)
    values, indices = scaled.topk(k, dim=-1)  # (B, T, k)
    reference = []
    for i, sample in enumerate(samples):
        row = []
        for position in range(sample.prompt_length - 1, len(sample.tokens) - 1):
            top = indices[i, position].tolist()
            token = sample.tokens[position + 1]
            assert token in top  # the token was drawn from the top k
            row.append(float(torch.log_softmax(values[i, position], dim=-1)[top.index(token)]))
        reference.append(row)
    return reference


def test_top_k_1_log_probs_are_zero(engine):
    samples = engine.generate(MIXED_PROMPTS, 4, 1.0, max_response_len=4, seed=0, sampling={"top_k": 1})
    assert all(abs(lp) <= 1e-6 for s in samples for lp in s.rollout_log_probs)
    assert all(len(ids) == 1 for s in samples for ids in s.sampling_kept_ids)


def test_top_k_3_log_probs_are_the_renormalized_top_3(engine):
    samples = engine.generate(MIXED_PROMPTS, 8, 0.8, max_response_len=5, seed=3, sampling={"top_k": 3})
    reference = _top_k_reference(engine.model, samples, 0.8, 3)
    _, tolerance = _full_forward_log_probs(engine.model, samples, 0.8)
    gap = max(abs(a - b) for s, ref in zip(samples, reference) for a, b in zip(s.rollout_log_probs, ref))
    assert gap <= tolerance
    assert all(len(ids) == 3 for s in samples for ids in s.sampling_kept_ids)


def test_the_trainer_recomputes_under_the_engines_kept_set(engine):
    """top-p 0.9, top-k 20: the trainer's forward pass (the torch backend's) under each sample's kept ids gives the
    engine's log-probs; without the kept ids it gives the whole softmax's, which differ."""
    temperature = 1.2
    samples = engine.generate(MIXED_PROMPTS, 8, temperature, max_response_len=5, seed=4,
                              sampling={"top_p": 0.9, "top_k": 20})
    _, tolerance = _full_forward_log_probs(engine.model, samples, temperature)
    with torch.no_grad():
        trainer, _ = response_log_probs(engine.model, samples, temperature)
    gap = max(float((t - torch.tensor(s.rollout_log_probs)).abs().max()) for t, s in zip(trainer, samples))
    assert gap <= tolerance
    full, _ = _full_forward_log_probs(engine.model, samples, temperature)
    truncated_mass = max(a - b for s, ref in zip(samples, full) for a, b in zip(s.rollout_log_probs, ref))
    assert truncated_mass > 1e-3  # top-p 0.9 dropped mass somewhere, so the whole softmax would not match
    for sample in samples:
        response = sample.tokens[sample.prompt_length:]
        assert all(token in ids for token, ids in zip(response, sample.sampling_kept_ids, strict=True))


def test_the_entropy_of_a_kept_set_is_finite_and_that_of_the_renormalized_distribution(engine):
    samples = engine.generate(MIXED_PROMPTS[:1], 2, 1.0, max_response_len=2, seed=0, sampling={"top_k": 2})
    with torch.no_grad():
        _, entropy = response_log_probs(engine.model, samples[:1], 1.0, with_entropy=True)
        logits = engine.model(input_ids=torch.tensor([samples[0].tokens])).logits[0]  # (T, V)
    position = samples[0].prompt_length - 1
    q = torch.softmax(logits[position].topk(2).values, dim=-1)
    assert float(entropy[0][0]) == pytest.approx(float(-(q * q.log()).sum()), abs=1e-5)


def test_sampling_follows_the_renormalized_distribution(engine):
    samples = engine.generate([{"prompt": "4+4=", "label": "8"}], 2000, 1.5, max_response_len=1, seed=0,
                              sampling={"top_k": 3})
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([samples[0].tokens[:-1]])).logits[0, -1] / 1.5  # (V,)
    values, indices = logits.topk(3)
    expected = torch.zeros_like(logits).scatter(0, indices, torch.softmax(values, dim=-1))
    counts = torch.bincount(torch.tensor([s.tokens[-1] for s in samples]), minlength=logits.numel())
    assert (counts / len(samples) - expected).abs().max() < 0.04  # 2000 draws: standard error <= 0.012


def test_full_log_probs_keep_upstreams_behavior(engine):
    samples = engine.generate(MIXED_PROMPTS, 4, 1.0, max_response_len=4, seed=1,
                              sampling={"top_k": 3, "logprobs": "full"})
    reference, tolerance = _full_forward_log_probs(engine.model, samples, 1.0)
    gap = max(abs(a - b) for s, ref in zip(samples, reference) for a, b in zip(s.rollout_log_probs, ref))
    assert gap <= tolerance
    assert all(s.sampling_kept_ids is None for s in samples)


def test_neutral_filters_are_the_whole_softmax_path(engine, embedded):
    prompts = _train_prompts(embedded)[:8]
    plain = engine.generate(prompts, 4, 1.0, 3, seed=9)
    neutral = engine.generate(prompts, 4, 1.0, 3, seed=9, sampling={"top_p": 1.0, "top_k": -1, "min_p": 0.0})
    assert [s.tokens for s in plain] == [s.tokens for s in neutral]
    assert [s.rollout_log_probs for s in plain] == [s.rollout_log_probs for s in neutral]
    assert all(s.sampling_kept_ids is None for s in plain)


def test_stop_token_ids_and_stop_strings_end_a_response_completed(engine, embedded):
    seven = engine.tokenizer.convert_tokens_to_ids("7")
    for sampling in ({"stop_token_ids": [seven]}, {"stop": ["7"]}):
        samples = engine.generate(_train_prompts(embedded), 4, 1.5, max_response_len=4, seed=1, sampling=sampling)
        ended_on_seven = [s for s in samples if s.tokens[-1] == seven]
        assert ended_on_seven and all(s.status == SampleStatus.COMPLETED for s in ended_on_seven)
        assert all(seven not in s.tokens[s.prompt_length:-1] for s in samples)


def test_every_eos_id_of_the_generation_config_stops(embedded, tmp_path):
    folder = tmp_path / "checkpoint"
    shutil.copytree(embedded.checkpoint_dir, folder)
    five = 8  # the token "5"
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS, five]}))
    engine = TorchRolloutEngine(str(folder), seed=0)
    samples = engine.generate(_train_prompts(embedded), 4, 1.5, max_response_len=4, seed=1)
    on_five = [s for s in samples if s.tokens[-1] == five]
    assert on_five and all(s.status == SampleStatus.COMPLETED for s in on_five)
    assert all(five not in s.tokens[s.prompt_length:-1] for s in samples)


def test_a_stop_id_outside_the_vocabulary_is_refused(engine):
    with pytest.raises(MilesConfigError, match=r"--rollout-stop-token-ids \[99\].*ids 0..14"):
        engine.generate(MIXED_PROMPTS, 1, 1.0, 2, seed=0, sampling={"stop_token_ids": [99]})
