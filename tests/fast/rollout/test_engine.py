"""The torch rollout engine: sampling, eos handling, log-prob agreement with a full forward pass, weights and
their fingerprint, and bad input. The reference log-probs are computed here, independently of the engine."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from miles.guard.fingerprint import weights_fingerprint
from miles.rollout.engine import TorchRolloutEngine, left_pad
from miles.utils.errors import DivergenceError, MilesConfigError
from miles.utils.types import SampleStatus

EOS = 2
# Prompts of different token lengths (5, 8, 3, 9): exercises left padding in the engine.
MIXED_PROMPTS = [
    {"prompt": "3+4=", "label": "7"},
    {"prompt": "12+345=", "label": "357"},
    {"prompt": "9=", "label": "9"},
    {"prompt": "1+1+1+1=", "label": "4"},
]


def _train_prompts(embedded):
    return [json.loads(line) for line in Path(embedded.train_jsonl).read_text().splitlines()]


FLOAT32_UNIT_ROUNDOFF = 2.0**-24


def _reduction_lengths(config, sequence_length: int) -> int:
    """The summed lengths of the reductions (dot products, norms, softmax sums) one logit passes through, layer by
    layer: input norm, q/k/v projection, attention scores (head dim), the attention-weighted sum (sequence
    length), output projection, post-attention norm, gate/up projection, down projection (FFN width); then the
    final norm and the LM head."""
    hidden = config.hidden_size
    ffn = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
    head_dim = hidden // config.num_attention_heads
    per_layer = 6 * hidden + head_dim + sequence_length + ffn
    return config.num_hidden_layers * per_layer + 2 * hidden


def _log_prob_tolerance(config, sequence_length: int, max_abs_scaled_logit: float) -> float:
    """How far the engine's log-probs (one position at a time, with a KV cache, left-padded) may sit from a full
    forward pass (every position at once, right-padded): the same float32 operations in other reduction orders.

    A reduction of n float32 terms carries a relative rounding error that grows like sqrt(n) * u (u = 2^-24; the
    usual estimate for rounding errors of random sign, against n * u in the worst case), and the errors of the
    chain of reductions a logit passes through add up: relative error ~ u * sqrt(sum of n) (``_reduction_lengths``:
    about 1500 for the embedded default at 20 positions, so 39 u). A log-prob z_t - logsumexp(z) of the logits
    z = logits / T carries that error once for z_t and once for the logsumexp, and each of the two computations
    carries its own: 4 u * sqrt(sum n) * max |z| = 9e-6 * max |z|. For the embedded default (max |z| 2-6) that is
    2-6e-5, against 0.5-1e-6 measured here and the runtime guard's 1e-4; a wrong position, mask or temperature
    moves log-probs by more than 1e-2.
    """
    return 4 * FLOAT32_UNIT_ROUNDOFF * math.sqrt(_reduction_lengths(config, sequence_length)) * max_abs_scaled_logit


def _full_forward_log_probs(model, samples, temperature):
    """Reference: one forward pass over prompt + response, right-padded with an attention mask; the log-prob of
    response token t is log_softmax(logits[prompt_len + t - 1] / temperature)[token]. Returns the per-sample
    log-probs and the tolerance of their agreement with the engine's (``_log_prob_tolerance``)."""
    width = max(len(s.tokens) for s in samples)
    input_ids = torch.zeros((len(samples), width), dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(samples), width), dtype=torch.long)  # (B, T)
    for i, sample in enumerate(samples):
        input_ids[i, : len(sample.tokens)] = torch.tensor(sample.tokens)
        attention_mask[i, : len(sample.tokens)] = 1
    with torch.no_grad():
        scaled = model(input_ids=input_ids, attention_mask=attention_mask).logits / temperature  # (B, T, V)
    log_probs = torch.log_softmax(scaled, dim=-1)
    result = []
    for i, sample in enumerate(samples):
        start = sample.prompt_length
        positions = range(start - 1, start - 1 + sample.response_length)
        result.append([log_probs[i, p, sample.tokens[p + 1]].item() for p in positions])
    max_abs = float(scaled[attention_mask.bool()].abs().max())
    return result, _log_prob_tolerance(model.config, width, max_abs)


def _worst_gap(samples, reference) -> float:
    return max(abs(a - b) for s, ref in zip(samples, reference) for a, b in zip(s.rollout_log_probs, ref))


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
def test_log_probs_match_a_full_forward_pass(engine, temperature):
    samples = engine.generate(MIXED_PROMPTS, 8, temperature, max_response_len=5, seed=3)
    reference, tolerance = _full_forward_log_probs(engine.model, samples, temperature)
    assert _worst_gap(samples, reference) <= tolerance
    assert {s.prompt_length for s in samples} == {3, 5, 8, 9}


def test_other_architectures_work_including_absolute_positions(embedded, tmp_path):
    """GPT-2 adds absolute position embeddings, so left padding must also shift the position ids (with RoPE, as
    in Qwen2, a constant shift cancels out and a wrong position id would go unnoticed)."""
    config = GPT2Config(vocab_size=15, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=1, eos_token_id=2)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        GPT2LMHeadModel(config).save_pretrained(tmp_path)
    PreTrainedTokenizerFast.from_pretrained(embedded.checkpoint_dir).save_pretrained(tmp_path)
    engine = TorchRolloutEngine(str(tmp_path), seed=0)
    samples = engine.generate(MIXED_PROMPTS, n_samples_per_prompt=4, temperature=0.8, max_response_len=4, seed=0)
    reference, tolerance = _full_forward_log_probs(engine.model, samples, 0.8)
    assert _worst_gap(samples, reference) <= tolerance


def test_log_probs_match_one_sample_at_a_time(engine):
    """Each sample alone (no padding anywhere) gives the same log-probs as in the left-padded batch."""
    samples = engine.generate(MIXED_PROMPTS, n_samples_per_prompt=2, temperature=1.0, max_response_len=4, seed=11)
    for sample in samples:
        alone, tolerance = _full_forward_log_probs(engine.model, [sample], 1.0)
        assert _worst_gap([sample], alone) <= tolerance


def test_sampling_follows_the_model_distribution(engine):
    """The frequencies of the first response token match softmax(logits / T) of the prompt."""
    temperature = 1.3
    samples = engine.generate([{"prompt": "4+4=", "label": "8"}], 2000, temperature, max_response_len=1, seed=0)
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([samples[0].tokens[:-1]])).logits[0, -1]  # (V,)
    probs = torch.softmax(logits / temperature, dim=-1)
    counts = torch.bincount(torch.tensor([s.tokens[-1] for s in samples]), minlength=probs.numel())
    assert (counts / len(samples) - probs).abs().max() < 0.04  # 2000 draws: standard error <= 0.012


def test_samples_are_ordered_grouped_and_stamped(engine, embedded):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(embedded.checkpoint_dir)
    samples = engine.generate(MIXED_PROMPTS, n_samples_per_prompt=3, temperature=1.0, max_response_len=3, seed=0)
    assert len(samples) == 12
    for index, sample in enumerate(samples):
        item = MIXED_PROMPTS[index // 3]
        assert (sample.index, sample.group_index) == (index, index // 3)
        assert (sample.prompt, sample.label) == (item["prompt"], item["label"])
        assert sample.tokens[: sample.prompt_length] == tokenizer(item["prompt"])["input_ids"]
        assert sample.response == tokenizer.decode(sample.tokens[sample.prompt_length :], skip_special_tokens=True)
        assert sample.weight_versions == [0]
        assert sample.weight_fingerprint == weights_fingerprint(engine.model)
        assert sample.reward is None


def test_engine_uses_the_saved_character_tokenizer(engine):
    assert type(engine.tokenizer) is PreTrainedTokenizerFast
    assert engine.tokenizer("3+4=")["input_ids"] == [1, 6, 13, 7, 14]
    assert (engine.eos_token_id, engine.pad_token_id) == (2, 0)


def test_generate_is_reproducible_for_the_same_seed(engine, embedded):
    prompts = _train_prompts(embedded)[:16]
    first = engine.generate(prompts, 8, 1.0, 3, seed=5)
    again = engine.generate(prompts, 8, 1.0, 3, seed=5)
    other = engine.generate(prompts, 8, 1.0, 3, seed=6)
    assert [s.tokens for s in first] == [s.tokens for s in again]
    assert [s.rollout_log_probs for s in first] == [s.rollout_log_probs for s in again]
    assert [s.tokens for s in first] != [s.tokens for s in other]
    # A second engine with the same base seed and weights reproduces it too (e.g. a resumed run).
    twin = TorchRolloutEngine(embedded.checkpoint_dir, seed=0)
    assert [s.tokens for s in twin.generate(prompts, 8, 1.0, 3, seed=5)] == [s.tokens for s in first]
    shifted = TorchRolloutEngine(embedded.checkpoint_dir, seed=1)
    assert [s.tokens for s in shifted.generate(prompts, 8, 1.0, 3, seed=5)] != [s.tokens for s in first]


def test_responses_stop_at_eos_and_statuses_are_right(engine, embedded):
    samples = engine.generate(_train_prompts(embedded), 4, temperature=1.5, max_response_len=4, seed=1)
    for sample in samples:
        response = sample.tokens[sample.prompt_length :]
        assert 1 <= sample.response_length == len(response) <= 4
        assert sample.loss_mask == [1] * sample.response_length  # <eos> included, nothing after it
        assert len(sample.rollout_log_probs) == sample.response_length
        assert all(math.isfinite(lp) and lp <= 0 for lp in sample.rollout_log_probs)
        assert EOS not in response[:-1]
        if response[-1] == EOS:
            assert sample.status == SampleStatus.COMPLETED
        else:
            assert sample.status == SampleStatus.TRUNCATED and sample.response_length == 4
    statuses = {s.status for s in samples}
    assert statuses == {SampleStatus.COMPLETED, SampleStatus.TRUNCATED}
    assert len({s.response_length for s in samples}) >= 3  # early eos in some rows, truncation in others


def test_a_one_token_budget_truncates_every_non_eos_answer(engine, embedded):
    samples = engine.generate(_train_prompts(embedded)[:16], 8, 1.0, max_response_len=1, seed=2)
    assert all(s.response_length == 1 for s in samples)
    for sample in samples:
        expected = SampleStatus.COMPLETED if sample.tokens[-1] == EOS else SampleStatus.TRUNCATED
        assert sample.status == expected
    assert any(s.status == SampleStatus.TRUNCATED for s in samples)


def test_load_weights_returns_the_fingerprint_and_stamps_the_version(embedded):
    engine = TorchRolloutEngine(embedded.checkpoint_dir, seed=0)
    state = {name: tensor.clone() for name, tensor in engine.model.state_dict().items()}
    before = engine.generate(MIXED_PROMPTS, 2, 1.0, 3, seed=0)
    changed = state["model.layers.1.mlp.down_proj.weight"]
    old_value = float(changed[3, 7])
    changed[3, 7] += 0.25
    fingerprint = engine.load_weights(state, version=4)
    assert fingerprint == weights_fingerprint(state) == weights_fingerprint(engine.model)
    assert float(changed[3, 7]) != old_value and fingerprint != before[0].weight_fingerprint
    after = engine.generate(MIXED_PROMPTS, 2, 1.0, 3, seed=0)
    assert all(s.weight_versions == [4] and s.weight_fingerprint == fingerprint for s in after)
    assert [s.rollout_log_probs for s in after] != [s.rollout_log_probs for s in before]
    reference, tolerance = _full_forward_log_probs(engine.model, after, 1.0)  # the weights sampled with
    assert _worst_gap(after, reference) <= tolerance


def test_weights_that_give_infinite_logits_stop_with_divergence_not_a_sampling_error(embedded):
    engine = TorchRolloutEngine(embedded.checkpoint_dir, seed=0)
    state = {name: tensor * 1e30 for name, tensor in engine.model.state_dict().items()}  # finite, far too large
    engine.load_weights(state, version=2)
    with pytest.raises(DivergenceError, match="next-token probabilities are not finite.*lower --lr"):
        engine.generate(MIXED_PROMPTS, 2, 1.0, 3, seed=0)


def test_load_pushed_reports_the_sent_and_the_loaded_fingerprint(embedded):
    """The RolloutManager compares the two; a wrong label on the push must show as a mismatch, not be echoed."""
    engine = TorchRolloutEngine(embedded.checkpoint_dir, seed=0)
    state = {name: tensor.clone() for name, tensor in engine.model.state_dict().items()}
    state["model.norm.weight"][0] += 0.5
    loaded = weights_fingerprint(state)
    assert engine.load_pushed({"version": 2, "fingerprint": loaded, "state_dict": state}) == (2, loaded, loaded)
    assert engine.load_pushed({"version": 3, "fingerprint": "0" * 64, "state_dict": state}) == (3, "0" * 64, loaded)
    assert engine.weight_version == 3


def test_load_weights_rejects_a_different_architecture(embedded):
    engine = TorchRolloutEngine(embedded.checkpoint_dir, seed=0)
    state = dict(engine.model.state_dict())
    del state["model.norm.weight"]
    with pytest.raises(RuntimeError, match=r"(?s)weight version 3 does not fit.*model\.norm\.weight"):
        engine.load_weights(state, version=3)
    assert engine.weight_version == 0


@pytest.mark.parametrize("budget", [0, -1, 1.5, True])
def test_response_budget_below_one_token_is_a_config_error(engine, budget):
    with pytest.raises(MilesConfigError, match=r"--rollout-max-response-len=.*at least 1 token"):
        engine.generate(MIXED_PROMPTS, 1, 1.0, budget, seed=0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"temperature": 0.0}, "--rollout-temperature"),
        ({"temperature": math.nan}, "--rollout-temperature"),
        ({"n_samples_per_prompt": 0}, "--n-samples-per-prompt"),
        ({"prompts": []}, "no prompts"),
    ],
)
def test_other_bad_generate_arguments_are_config_errors(engine, kwargs, match):
    call = {"prompts": MIXED_PROMPTS, "n_samples_per_prompt": 1, "temperature": 1.0, "max_response_len": 3, "seed": 0}
    with pytest.raises(MilesConfigError, match=match):
        engine.generate(**{**call, **kwargs})


def test_a_prompt_without_tokens_is_a_config_error(embedded):
    engine = TorchRolloutEngine(embedded.checkpoint_dir, seed=0)
    engine.tokenizer.backend_tokenizer.post_processor = None  # no <bos>: "" now encodes to nothing at all
    with pytest.raises(MilesConfigError, match=r"prompt '' encodes to no tokens"):
        engine.generate([{"prompt": "", "label": "0"}], 1, 1.0, 3, seed=0)


def test_a_prompt_outside_the_vocabulary_names_its_characters_not_a_missing_unk(engine):
    # The embedded tokenizer has no unknown token; the tokenizers library's own message names an absent [UNK].
    with pytest.raises(MilesConfigError, match=r"^prompt '1\+é=' has characters that are not in the vocabulary of "
                                               r"the --hf-checkpoint tokenizer \('é'\)") as caught:
        engine.generate([{"prompt": "1+1=", "label": "2"}, {"prompt": "1+é=", "label": "2"}], 1, 1.0, 3, seed=0)
    assert "[UNK]" not in str(caught.value)


def test_a_prompt_that_does_not_fit_the_model_s_positions_is_refused_when_first_generated(engine):
    with pytest.raises(MilesConfigError, match=r"^prompt '1\+' is 3 tokens, which with --rollout-max-response-len 62 "
                                               r"exceeds the model's 64 positions"):
        engine.generate([{"prompt": "1+", "label": "1"}], 1, 1.0, 62, seed=0)
    assert len(engine.generate([{"prompt": "1+", "label": "1"}], 1, 1.0, 61, seed=0)) == 1  # 3 + 61 = 64 fit


def test_missing_or_invalid_checkpoint_folders_are_config_errors(tmp_path):
    with pytest.raises(MilesConfigError, match=r"--hf-checkpoint .*nope.*no such folder"):
        TorchRolloutEngine(str(tmp_path / "nope"), seed=0)
    with pytest.raises(MilesConfigError, match=r"has no config\.json"):
        TorchRolloutEngine(str(tmp_path), seed=0)
    (tmp_path / "config.json").write_text('{"model_type": "not-a-model"}')
    with pytest.raises(MilesConfigError, match=r"the folder has no weights"):
        TorchRolloutEngine(str(tmp_path), seed=0)
    save_file({"weight": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(MilesConfigError, match=r"transformers cannot load a causal LM"):
        TorchRolloutEngine(str(tmp_path), seed=0)


def test_bad_thread_count_is_a_config_error(embedded):
    with pytest.raises(MilesConfigError, match="num_threads=0"):
        TorchRolloutEngine(embedded.checkpoint_dir, seed=0, num_threads=0)


def test_left_pad_builds_ids_and_mask():
    input_ids, attention_mask = left_pad([[5, 6, 7], [8]], pad_token_id=0)
    assert input_ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_the_engine_fingerprints_the_weights_it_holds(embedded, engine):
    """The fingerprint's own tests are in tests/fast/guard/test_fingerprint.py; here: the engine's model is read
    through ``state_dict()``, so a copy of that dict (as the trainer pushes it) gives the same value."""
    state = engine.model.state_dict()
    assert engine.weight_fingerprint == weights_fingerprint(engine.model) == weights_fingerprint(
        {name: tensor.clone() for name, tensor in state.items()})
