"""Atomic checkpoints: HF weights (safetensors) and trainer state round-trip, the latest marker, crash safety,
re-saving a rollout, and the tokenizer files. The model is a tiny Qwen2 built here (hidden 16, one layer)."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import Qwen2Config, Qwen2ForCausalLM

from miles.backends.training_utils.checkpoint import (
    CHECKPOINT_FORMAT,
    LATEST_FILE,
    RUN_STATE_FILE,
    check_same_optimizer,
    check_same_train_backend,
    inexact_resume_reason,
    latest_rollout_id,
    load_run_state,
    load_trainer_state,
    mark_latest,
    rollout_dir,
    save_role,
    save_run_state,
)
from miles.models.hf import load_causal_lm
from miles.utils.errors import MilesConfigError

TOKENIZER_FILES = {"tokenizer.json": '{"fake": 1}', "tokenizer_config.json": '{"x": 2}',
                   "special_tokens_map.json": '{"eos_token": "<eos>"}'}


def _tiny_model(seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=12, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                         tie_word_embeddings=False)
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture
def tokenizer_source(tmp_path) -> Path:
    """A model folder as --hf-checkpoint would be: tokenizer files plus a config and weights of its own."""
    folder = tmp_path / "hf"
    folder.mkdir()
    for name, text in TOKENIZER_FILES.items():
        (folder / name).write_text(text)
    (folder / "config.json").write_text('{"not": "this one"}')
    (folder / "model.safetensors").write_bytes(b"not these weights")
    (folder / "notes.txt").write_text("not a tokenizer file")
    return folder


def _trainer_state(seed: int) -> dict:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    return {"rollout_id": seed, "weight_version": seed + 1, "optimizer": optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(), "python_rng": (3, tuple(range(5)), None)}


def _assert_same_weights(expected: torch.nn.Module, actual: dict[str, torch.Tensor]) -> None:
    expected_state = expected.state_dict()
    assert set(actual) == set(expected_state)
    for name, tensor in expected_state.items():
        assert torch.equal(actual[name], tensor), name


def _leftovers(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob(".*"))


def test_weights_and_state_round_trip(tmp_path, tokenizer_source):
    model, state = _tiny_model(0), _trainer_state(4)
    role_dir = save_role(str(tmp_path), 4, "actor", model, state, str(tokenizer_source))
    assert role_dir == tmp_path / "rollout_000004" / "actor" == rollout_dir(str(tmp_path), 4) / "actor"
    _assert_same_weights(model, load_file(role_dir / "model.safetensors"))
    _assert_same_weights(model, load_causal_lm(str(role_dir)).state_dict())
    loaded = load_trainer_state(role_dir)
    assert loaded["rollout_id"] == 4 and loaded["weight_version"] == 5
    assert loaded["python_rng"] == state["python_rng"]
    assert torch.equal(loaded["torch_rng"], state["torch_rng"])
    for key, moments in state["optimizer"]["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(loaded["optimizer"]["state"][key][name], moments[name])
    assert _leftovers(tmp_path) == []


def test_latest_marker(tmp_path):
    assert latest_rollout_id(str(tmp_path)) is None
    mark_latest(str(tmp_path), 3)
    assert latest_rollout_id(str(tmp_path)) == 3
    mark_latest(str(tmp_path), 12)
    assert latest_rollout_id(str(tmp_path)) == 12
    assert (tmp_path / LATEST_FILE).read_text().strip() == "12"
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("crashed_rollout", [2, 1], ids=["new-rollout", "re-save-of-latest"])
def test_crash_mid_save_leaves_no_partial_folder_and_keeps_the_previous_latest(
    tmp_path, tokenizer_source, monkeypatch, crashed_rollout
):
    first = _tiny_model(0)
    save_role(str(tmp_path), 1, "actor", first, _trainer_state(1), str(tokenizer_source))
    mark_latest(str(tmp_path), 1)

    def crash(*_args, **_kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_role(str(tmp_path), crashed_rollout, "actor", _tiny_model(1), _trainer_state(2), str(tokenizer_source))
    monkeypatch.undo()

    crashed_dir = rollout_dir(str(tmp_path), crashed_rollout)
    assert sorted(p.name for p in crashed_dir.iterdir()) == (["actor"] if crashed_rollout == 1 else [])
    assert _leftovers(tmp_path) == []
    assert latest_rollout_id(str(tmp_path)) == 1
    latest = rollout_dir(str(tmp_path), 1) / "actor"
    _assert_same_weights(first, load_file(latest / "model.safetensors"))
    assert load_trainer_state(latest)["rollout_id"] == 1


def test_resaving_a_rollout_replaces_it(tmp_path, tokenizer_source):
    save_role(str(tmp_path), 5, "actor", _tiny_model(0), _trainer_state(1), str(tokenizer_source))
    second = _tiny_model(1)
    role_dir = save_role(str(tmp_path), 5, "actor", second, _trainer_state(2), tokenizer_source=None)
    _assert_same_weights(second, load_file(role_dir / "model.safetensors"))
    assert load_trainer_state(role_dir)["rollout_id"] == 2
    assert not any((role_dir / name).exists() for name in TOKENIZER_FILES)  # replaced, not overlaid
    assert sorted(p.name for p in role_dir.parent.iterdir()) == ["actor"]


def test_tokenizer_files_are_copied_and_nothing_else(tmp_path, tokenizer_source):
    model = _tiny_model(0)
    role_dir = save_role(str(tmp_path / "save"), 0, "actor", model, _trainer_state(0), str(tokenizer_source))
    for name, text in TOKENIZER_FILES.items():
        assert (role_dir / name).read_text() == text
    assert not (role_dir / "notes.txt").exists()
    assert "not this one" not in (role_dir / "config.json").read_text()
    _assert_same_weights(model, load_file(role_dir / "model.safetensors"))


def test_roles_of_one_rollout_sit_side_by_side(tmp_path):
    actor, critic = _tiny_model(0), _tiny_model(1)
    save_role(str(tmp_path), 0, "actor", actor, _trainer_state(0), None)
    save_role(str(tmp_path), 0, "critic", critic, _trainer_state(0), None)
    _assert_same_weights(actor, load_file(rollout_dir(str(tmp_path), 0) / "actor" / "model.safetensors"))
    _assert_same_weights(critic, load_file(rollout_dir(str(tmp_path), 0) / "critic" / "model.safetensors"))


def test_resuming_needs_the_backend_that_saved_the_optimizer_state(tmp_path):
    role_dir = tmp_path / "rollout_000003" / "actor"
    check_same_train_backend({"train_backend": "megatron"}, role_dir, "megatron")
    check_same_train_backend({}, role_dir, "torch")  # saved before the flag existed: the torch backend's
    with pytest.raises(MilesConfigError, match="saved with --train-backend torch") as caught:
        check_same_train_backend({"train_backend": "torch"}, role_dir, "megatron")
    assert f"--hf-checkpoint {role_dir}" in str(caught.value)  # the way to keep the weights


def test_a_save_prints_no_progress_bar_and_leaves_transformers_bars_as_they_were(tmp_path, capfd):
    from transformers.utils import logging as transformers_logging

    transformers_logging.enable_progress_bar()
    save_role(str(tmp_path), 0, "actor", _tiny_model(0), _trainer_state(0), None)
    assert "Writing" not in capfd.readouterr().err  # transformers' "Writing model shards" bar
    assert transformers_logging.is_progress_bar_enabled()


def test_a_checkpoint_without_the_schedules_position_or_of_another_optimizer_is_refused(tmp_path):
    state = {"optimizer": {"param_groups": [{}, {}]}, "optimizer_name": "adam", "optimizer_steps": 6}
    check_same_optimizer(state, tmp_path, "adam", 2)
    old = {"optimizer": {"param_groups": [{}]}}  # before the schedule: one Adam group, no step count
    with pytest.raises(MilesConfigError, match="cannot resume it exactly.*--hf-checkpoint"):
        check_same_optimizer(old, tmp_path, "adam", 2)
    with pytest.raises(MilesConfigError, match="saved with --optimizer adam.*Resume with --optimizer adam"):
        check_same_optimizer(state, tmp_path, "sgd", 2)


def _run_state(**changes) -> dict:
    state = {"format": 2, "driver": "train_async", "update_weights_interval": 2, "keeps_snapshots": True,
             "staleness_origin": 0, "prompt_position": 12, "in_flight": {"rollout": "rollout 3", "metrics": {}}}
    return {**state, **changes}


def test_run_state_round_trips_with_the_format_and_a_newer_format_is_refused(tmp_path):
    root = str(tmp_path)
    rollout_dir(root, 2).mkdir(parents=True)
    assert load_run_state(root, 2) is None  # format 1: no run_state.pt
    fields = {key: value for key, value in _run_state().items() if key != "format"}
    save_run_state(root, 2, fields)
    assert load_run_state(root, 2) == {"format": CHECKPOINT_FORMAT, **fields}
    assert [path.name for path in rollout_dir(root, 2).iterdir()] == [RUN_STATE_FILE]  # no staging file left
    torch.save(_run_state(format=CHECKPOINT_FORMAT + 1), rollout_dir(root, 2) / RUN_STATE_FILE)
    with pytest.raises(MilesConfigError, match=f"format {CHECKPOINT_FORMAT + 1}, newer than this miles'"):
        load_run_state(root, 2)


@pytest.mark.parametrize(("run_state", "driver", "interval", "keeps_snapshots", "start", "words"), [
    (_run_state(), "train_async", 2, True, None, None),
    (_run_state(), "train_async", 2, True, 3, None),
    (None, "train_async", 2, True, None, "checkpoint format 1"),
    (_run_state(), "train_async", 2, True, 5, "--start-rollout-id 5"),
    (_run_state(), "train", 2, True, None, "saved by train_async.py"),
    (_run_state(), "train_async", 1, True, None, "--update-weights-interval 2"),
    (_run_state(), "train_async", 2, False, None,
     "saved with a weight snapshot per pushed version (--keep-old-actor), and this run keeps none"),
    (_run_state(in_flight=None), "train_async", 2, True, None, "no rollout was in flight"),
    (_run_state(driver="train", in_flight=None), "train", 1, True, None, None),  # sync: nothing is in flight
])
def test_a_resume_is_exact_only_when_it_continues_the_saving_run(run_state, driver, interval, keeps_snapshots, start,
                                                                  words):
    reason = inexact_resume_reason(run_state, driver, interval, keeps_snapshots, start, saved_rollout_id=2)
    assert reason is None if words is None else words in reason
