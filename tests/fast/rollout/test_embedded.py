"""The embedded default: tokenizer, model shape, task data, warm-up accuracy, and the atomic cache."""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, PreTrainedTokenizerFast

from miles.rollout import embedded as embedded_lib
from miles.rollout.embedded import ensure_embedded_default
from miles.utils.errors import MilesConfigError


def _read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_tokenizer_is_one_token_per_character_with_bos(embedded):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(embedded.checkpoint_dir)
    expected_vocab = ["<pad>", "<bos>", "<eos>", *"0123456789", "+", "="]
    assert tokenizer.convert_ids_to_tokens(list(range(15))) == expected_vocab
    assert len(tokenizer) == 15
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    # "3+4=" -> <bos> 3 + 4 = ; digit d has id 3 + d
    assert tokenizer("3+4=")["input_ids"] == [1, 6, 13, 7, 14]
    assert tokenizer("12", add_special_tokens=False)["input_ids"] == [4, 5]
    assert tokenizer.decode([1, 6, 13, 7, 14, 10, 2], skip_special_tokens=True) == "3+4=7"
    assert tokenizer.decode([4, 5, 2]) == "12<eos>"


def test_model_is_the_documented_tiny_qwen2_in_safetensors(embedded):
    folder = Path(embedded.checkpoint_dir)
    config = AutoConfig.from_pretrained(folder)
    assert config.model_type == "qwen2"
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (64, 2, 4)
    assert config.tie_word_embeddings and config.vocab_size == 15
    assert not list(folder.glob("*.bin")), "weights must be safetensors only"
    weights = load_file(folder / "model.safetensors")
    assert {tensor.dtype for tensor in weights.values()} == {torch.float32}
    hidden, mlp, vocab = 64, 256, 15
    per_layer = 4 * hidden * hidden + 3 * hidden + 3 * hidden * mlp + 2 * hidden  # q,k,v,o + qkv bias + MLP + 2 norms
    expected = vocab * hidden + 2 * per_layer + hidden  # tied embedding + layers + final norm
    assert sum(t.numel() for name, t in weights.items() if name != "lm_head.weight") == expected == 132736


def test_task_splits_cover_all_pairs_without_overlap(embedded):
    train, held_out = _read_jsonl(embedded.train_jsonl), _read_jsonl(embedded.eval_jsonl)
    assert (len(train), len(held_out)) == (80, 20)
    train_prompts = {row["prompt"] for row in train}
    eval_prompts = {row["prompt"] for row in held_out}
    assert not train_prompts & eval_prompts
    assert train_prompts | eval_prompts == {f"{a}+{b}=" for a in range(10) for b in range(10)}
    for row in train + held_out:
        assert set(row) == {"prompt", "label"}
        a, b = int(row["prompt"][0]), int(row["prompt"][2])
        assert row["label"] == str(a + b)


def test_build_is_deterministic_and_leaves_global_rng_alone(tmp_path, embedded):
    rng_before = torch.get_rng_state()
    rebuilt = ensure_embedded_default(str(tmp_path))
    assert torch.equal(torch.get_rng_state(), rng_before)
    ours = load_file(Path(rebuilt.checkpoint_dir) / "model.safetensors")
    session = load_file(Path(embedded.checkpoint_dir) / "model.safetensors")
    assert ours.keys() == session.keys()
    assert all(torch.equal(ours[name], session[name]) for name in ours)
    assert Path(rebuilt.train_jsonl).read_text() == Path(embedded.train_jsonl).read_text()
    assert Path(rebuilt.eval_jsonl).read_text() == Path(embedded.eval_jsonl).read_text()


def test_warmup_start_accuracy_is_low_but_not_zero(embedded, engine):
    """docs/design.md §5: the SFT stops early (about 10 % sampled accuracy), so RL has something to show. The model is
    trained on the machine that runs the test, and where its 50 steps land depends on that CPU's float arithmetic
    (40 steps gave about 7 %, 70 about 19 %), so the bounds are what the design needs rather than one machine's
    number: rewards to learn from (at least 2 %: a few correct samples in every 128-sample rollout, against well
    under 1 % for a uniform guess of a two-token answer from 15 tokens) and most of the task left (at most 50 %).
    Each accuracy is over 640 samples or more (32 per prompt): its sampling error is about 1 % at most."""
    for path in (embedded.train_jsonl, embedded.eval_jsonl):
        prompts = _read_jsonl(path)
        samples = engine.generate(prompts, n_samples_per_prompt=32, temperature=1.0, max_response_len=3, seed=7)
        accuracy = sum(sample.response == sample.label for sample in samples) / len(samples)
        assert 0.02 <= accuracy <= 0.5, (path, accuracy)


def test_sft_warmup_lowers_the_answer_loss():
    tokenizer = embedded_lib.build_tokenizer()
    train_pairs, _ = embedded_lib.split_pairs()
    with torch.random.fork_rng():
        model = embedded_lib.build_model(seed=0)
    losses = embedded_lib.sft_warmup(model, tokenizer, train_pairs, steps=20)
    assert losses[0] > 2.0  # ~ln(15) = 2.7 for a uniform guess
    assert losses[-1] < 0.7 * losses[0]


def test_sft_batch_scores_only_the_answer_tokens():
    tokenizer = embedded_lib.build_tokenizer()
    input_ids, attention_mask, labels = embedded_lib.sft_batch(tokenizer, [(3, 4), (9, 8)])
    # <bos> 3 + 4 = 7 <eos> <pad>  and  <bos> 9 + 8 = 1 7 <eos>
    assert input_ids.tolist() == [[1, 6, 13, 7, 14, 10, 2, 0], [1, 12, 13, 11, 14, 4, 10, 2]]
    assert attention_mask.tolist() == [[1, 1, 1, 1, 1, 1, 1, 0], [1] * 8]
    assert labels.tolist() == [[-100] * 5 + [10, 2, -100], [-100] * 5 + [4, 10, 2]]


def test_second_call_returns_the_cache_without_rebuilding(embedded, monkeypatch):
    root = Path(embedded.checkpoint_dir).parent.parent

    def must_not_build(out_dir):
        raise AssertionError("the cache was complete; nothing should be rebuilt")

    monkeypatch.setattr(embedded_lib, "build_embedded_default", must_not_build)
    assert ensure_embedded_default(str(root)) == embedded
    assert [p.name for p in root.iterdir()] == ["embedded-v2"]  # no temporary build folders left


def test_cache_root_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MILES_CACHE_DIR", str(tmp_path / "from-env"))
    assert embedded_lib.default_cache_root() == tmp_path / "from-env"
    monkeypatch.delenv("MILES_CACHE_DIR")
    assert embedded_lib.default_cache_root() == Path.home() / ".cache" / "miles"


def test_ensure_uses_the_environment_root(tmp_path, monkeypatch):
    monkeypatch.setenv("MILES_CACHE_DIR", str(tmp_path))
    (tmp_path / "embedded-v2").mkdir()
    (tmp_path / "embedded-v2" / "manifest.json").write_text("{}")  # a complete cache is known by its manifest
    paths = ensure_embedded_default()
    assert paths.checkpoint_dir == str(tmp_path / "embedded-v2" / "checkpoint")


def test_crash_mid_build_leaves_no_cache(tmp_path, monkeypatch):
    def crash_after_half(out_dir):
        (out_dir / "checkpoint").mkdir()
        (out_dir / "checkpoint" / "config.json").write_text("{}")
        raise KeyboardInterrupt  # e.g. the user pressed Ctrl-C mid-build

    monkeypatch.setattr(embedded_lib, "build_embedded_default", crash_after_half)
    with pytest.raises(KeyboardInterrupt):
        ensure_embedded_default(str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # neither a cache nor the temporary folder


def test_losing_a_build_race_keeps_the_winners_cache(tmp_path, monkeypatch):
    """Another process publishes while we build: our os.replace fails, we drop our copy and use theirs."""
    real_build = embedded_lib.build_embedded_default
    calls = []

    def build_while_another_process_wins(out_dir):
        calls.append(out_dir)
        if len(calls) == 1:
            ensure_embedded_default(str(tmp_path))  # the "other process": builds and publishes first
        real_build(out_dir)

    monkeypatch.setattr(embedded_lib, "build_embedded_default", build_while_another_process_wins)
    paths = ensure_embedded_default(str(tmp_path))
    assert len(calls) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["embedded-v2"]
    assert json.loads((tmp_path / "embedded-v2" / "manifest.json").read_text())["cache_version"] == "embedded-v2"
    assert Path(paths.checkpoint_dir, "model.safetensors").is_file()


def test_foreign_folder_in_the_cache_slot_is_a_clear_error(tmp_path):
    (tmp_path / "embedded-v2").mkdir()
    with pytest.raises(MilesConfigError, match=r"no manifest\.json.*Delete that folder"):
        ensure_embedded_default(str(tmp_path))


def test_unwritable_cache_root_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(MilesConfigError, match="MILES_CACHE_DIR"):
        ensure_embedded_default(str(blocker / "cache"))


def test_stale_build_folders_are_removed_but_fresh_ones_kept(tmp_path):
    stale = tmp_path / ".embedded-v2.build-old"
    fresh = tmp_path / ".embedded-v2.build-running"
    stale.mkdir()
    fresh.mkdir()
    two_hours_ago = stale.stat().st_mtime - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    embedded_lib._remove_stale_builds(tmp_path)
    assert not stale.exists() and fresh.exists()
