"""What training_run checks in the driver process before Ray starts (miles/ray/preflight.py), on real files."""

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from miles.backends.training_utils import checkpoint
from miles.models.hf import load_causal_lm
from miles.ray import preflight as preflight_module
from miles.utils.arguments import parse_args
from miles.utils.errors import MilesConfigError
from miles.ray.preflight import check_rollouts_left, preflight


def _args(embedded, tmp_path: Path, *argv: str):
    return parse_args(argv=["--hf-checkpoint", embedded.checkpoint_dir, "--prompt-data", embedded.train_jsonl,
                            "--eval-prompt-data", embedded.eval_jsonl, "--log-dir", str(tmp_path / "run"),
                            "--train-backend", "torch", *argv])  # the saved runs here are the torch backend's


def _files_under(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def _refused(args, pattern: str) -> str:
    with pytest.raises(MilesConfigError, match=pattern) as caught:
        preflight(args)
    return str(caught.value)


@pytest.fixture(scope="module")
def saved_run(embedded, tmp_path_factory) -> Path:
    """A --save folder holding rollout 3 of a PPO run (actor and critic), written by the real checkpoint code."""
    root = tmp_path_factory.mktemp("saved")
    model = load_causal_lm(embedded.checkpoint_dir)
    state = {"rollout_id": 3, "weight_version": 4, "optimizer": torch.optim.Adam(model.parameters()).state_dict()}
    for role in ("actor", "critic"):
        checkpoint.save_role(str(root), 3, role, model, state, embedded.checkpoint_dir)
    checkpoint.mark_latest(str(root), 3)
    return root


@pytest.fixture
def save_copy(saved_run, tmp_path) -> Path:
    """A copy of ``saved_run`` this test may damage."""
    return Path(shutil.copytree(saved_run, tmp_path / "save"))


def test_good_input_passes_and_nothing_is_written(embedded, tmp_path):
    args = _args(embedded, tmp_path, "--save", str(tmp_path / "ckpt" / "a"), "--load", str(tmp_path / "ckpt" / "a"))
    before = _files_under(tmp_path)
    assert preflight(args) == 80  # the embedded task's training prompts
    assert _files_under(tmp_path) == before  # no log dir, no save folder, no probe file


# ------------------------------------------------------------------------------------------------ --load


def test_a_missing_load_folder_is_refused_unless_it_is_also_the_save_folder(embedded, tmp_path):
    missing = str(tmp_path / "typo")
    _refused(_args(embedded, tmp_path, "--load", missing), r"^--load .*typo' does not exist, so there is nothing to "
             r"resume\. Pass the --save folder .* pass the same folder to --load and --save\.$")
    preflight(_args(embedded, tmp_path, "--load", missing, "--save", missing))  # the relaunch idiom: start fresh
    preflight(_args(embedded, tmp_path, "--load", missing, "--save", missing + "/"))  # the same folder, spelled apart


def test_a_load_folder_without_checkpoint_is_refused_unless_it_is_also_the_save_folder(embedded, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    _refused(_args(embedded, tmp_path, "--load", str(empty)), "holds no checkpoint")
    preflight(_args(embedded, tmp_path, "--load", str(empty), "--save", str(empty)))
    (tmp_path / "file").write_text("x")
    _refused(_args(embedded, tmp_path, "--load", str(tmp_path / "file")), "is a file, not a checkpoint folder")


def test_a_complete_checkpoint_loads(embedded, tmp_path, saved_run):
    preflight(_args(embedded, tmp_path, "--advantage-estimator", "ppo", "--load", str(saved_run)))


def test_a_checkpoint_resumes_only_with_the_backend_that_saved_it(embedded, tmp_path, saved_run):
    """The saved state has no train_backend key: a checkpoint from before the flag, the torch backend's."""
    _refused(_args(embedded, tmp_path, "--train-backend", "megatron", "--load", str(saved_run)),
             r"saved with --train-backend torch, but this run uses --train-backend megatron")


def test_a_garbage_marker_is_one_clean_error(embedded, tmp_path, save_copy):
    (save_copy / checkpoint.LATEST_FILE).write_text("garbage\n")
    _refused(_args(embedded, tmp_path, "--load", str(save_copy)), r"reads 'garbage', not a rollout id")


def test_a_marker_naming_a_deleted_folder_blames_load_not_the_hf_checkpoint(embedded, tmp_path, save_copy):
    shutil.rmtree(save_copy / "rollout_000003")
    message = _refused(_args(embedded, tmp_path, "--load", str(save_copy)),
                       r"^--load .*: its latest marker names rollout 3, but .*rollout_000003/actor does not exist")
    assert "--hf-checkpoint '" not in message


def test_a_checkpoint_without_the_critic_is_refused_for_ppo(embedded, tmp_path, save_copy):
    shutil.rmtree(save_copy / "rollout_000003" / "critic")
    preflight(_args(embedded, tmp_path, "--load", str(save_copy)))  # GRPO needs only the actor
    _refused(_args(embedded, tmp_path, "--advantage-estimator", "ppo", "--load", str(save_copy)),
             r"^--critic-load .*rollout_000003/critic does not exist \(deleted, moved, or saved without a critic\)")


def test_a_truncated_trainer_state_is_one_clean_error(embedded, tmp_path, save_copy):
    state = save_copy / "rollout_000003" / "actor" / checkpoint.TRAINER_STATE_FILE
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    _refused(_args(embedded, tmp_path, "--load", str(save_copy)), r"^--load .*trainer_state\.pt cannot be loaded \(")


def test_truncated_checkpoint_weights_are_one_clean_error(embedded, tmp_path, save_copy):
    weights = save_copy / "rollout_000003" / "actor" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    _refused(_args(embedded, tmp_path, "--load", str(save_copy)),
             r"^--load .*the checkpoint of rollout 3, .*model\.safetensors is truncated or damaged")


# ------------------------------------------------------------------------------------------ --hf-checkpoint


@pytest.fixture
def hf_copy(embedded, tmp_path) -> Path:
    return Path(shutil.copytree(embedded.checkpoint_dir, tmp_path / "model"))


def test_an_hf_checkpoint_without_weights_is_refused(embedded, tmp_path, hf_copy):
    (hf_copy / "model.safetensors").unlink()
    _refused(_args(embedded, tmp_path, "--hf-checkpoint", str(hf_copy)), r"^--hf-checkpoint .*has no weights")


@pytest.mark.parametrize("keep_bytes", [4, 200, -1])  # inside the length prefix, inside the header, one byte short
def test_a_truncated_hf_checkpoint_is_refused(embedded, tmp_path, hf_copy, keep_bytes):
    weights = hf_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:keep_bytes])
    _refused(_args(embedded, tmp_path, "--hf-checkpoint", str(hf_copy)), r"model\.safetensors is truncated or damaged")


def test_a_sharded_hf_checkpoint_with_a_missing_shard_is_refused(embedded, tmp_path, hf_copy):
    (hf_copy / "model.safetensors").rename(hf_copy / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (hf_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    _refused(_args(embedded, tmp_path, "--hf-checkpoint", str(hf_copy)),
             r"its weights file model-00002-of-00002\.safetensors is missing")


# ------------------------------------------------------------------------- --save, --critic-save, --log-dir


@pytest.mark.parametrize("flag", ["--save", "--critic-save", "--log-dir"])
def test_an_output_folder_under_a_regular_file_is_refused(embedded, tmp_path, flag):
    (tmp_path / "file").write_text("x")
    args = _args(embedded, tmp_path, "--advantage-estimator", "ppo", flag, str(tmp_path / "file" / "sub"))
    _refused(args, f"^{flag} .*file/sub' cannot be a folder: .*file is a file")


@pytest.mark.parametrize("flag", ["--save", "--log-dir"])
def test_an_output_folder_on_a_file_system_without_write_access_is_refused(embedded, tmp_path, monkeypatch, flag):
    """The probe creates a file in the nearest existing folder; when the OS refuses it (here a read-only file
    system, injected at the probe: no folder refuses root on every machine, and a chmod does not stop root), the
    run is refused with the flag, the path and the OS's reason."""
    probed = []

    def read_only_file_system(dir=None, **kwargs):
        probed.append(dir)
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(preflight_module.tempfile, "TemporaryFile", read_only_file_system)
    target = tmp_path / "mounted" / "run"
    (tmp_path / "mounted").mkdir()
    _refused(_args(embedded, tmp_path, flag, str(target)),
             f"^{flag} '{target}' is not writable: creating a file in {tmp_path / 'mounted'} failed "
             rf"\({os.strerror(errno.EROFS)}\)")
    assert probed == [tmp_path / "mounted"]


# ------------------------------------------------------------------------------------------- prompt data


def _prompts(tmp_path: Path, *prompts: str) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": prompt, "label": "1"}) + "\n" for prompt in prompts))
    return str(path)


def test_a_folder_passed_as_prompt_data_says_so(embedded, tmp_path):
    _refused(_args(embedded, tmp_path, "--prompt-data", str(tmp_path)), r"^--prompt-data .*: a folder, not a file")


def test_a_prompt_with_characters_outside_the_vocabulary_names_the_row_and_the_characters(embedded, tmp_path):
    data = _prompts(tmp_path, "1+1=", "2+2=", "é+1=")
    message = _refused(_args(embedded, tmp_path, "--prompt-data", data),
                       r"^--prompt-data .* prompt 3 \('é\+1='\) has characters that are not in the vocabulary "
                       r".*\('é'\)")
    assert "[UNK]" not in message


def test_a_prompt_too_long_for_the_model_names_the_row_and_the_fix(embedded, tmp_path):
    data = _prompts(tmp_path, "1+1=", "1" * 83)  # 84 tokens with <bos>; the embedded model has 64 positions
    _refused(_args(embedded, tmp_path, "--prompt-data", data),
             r"prompt 2 .* is 84 tokens, which with --rollout-max-response-len 3 exceeds the model's 64 positions")


def test_the_response_budget_counts_against_the_model_s_positions(embedded, tmp_path):
    # every embedded prompt is 5 tokens: 5 + 59 = 64 positions fit, 5 + 60 do not
    preflight(_args(embedded, tmp_path, "--rollout-max-response-len", "59"))
    _refused(_args(embedded, tmp_path, "--rollout-max-response-len", "60"),
             r"is 5 tokens, which with --rollout-max-response-len 60 .* lower --rollout-max-response-len to 59 or less")


def test_an_eval_prompt_is_checked_and_named_as_the_eval_flag(embedded, tmp_path):
    _refused(_args(embedded, tmp_path, "--eval-prompt-data", _prompts(tmp_path, "é")),
             r"^--eval-prompt-data .* prompt 1")


@pytest.mark.parametrize("limit, value", [("PREFLIGHT_MAX_PROMPTS", 3), ("PREFLIGHT_MAX_PROMPT_CHARS", 12)])
def test_large_prompt_files_are_left_to_the_engine(embedded, tmp_path, monkeypatch, limit, value):
    data = _prompts(tmp_path, "1+1=", "2+2=", "é+1=")  # 3 prompts, 12 characters per file
    args = _args(embedded, tmp_path, "--prompt-data", data, "--eval-prompt-data", data)
    monkeypatch.setattr(preflight_module, limit, value * 2)  # both files together: just within the limit
    _refused(args, "prompt 3")
    monkeypatch.setattr(preflight_module, limit, value * 2 - 1)  # just over it: as if the files held millions
    assert preflight(args) == 3


# ------------------------------------------------------------------------------------------ rollouts left


def test_resuming_a_finished_run_is_refused_before_ray_starts(tmp_path):
    checkpoint.mark_latest(str(tmp_path), 9)
    finished = r"start at rollout 10 \(--load .* holds rollout 9\), but --num-rollout is 10"
    with pytest.raises(MilesConfigError, match=finished):
        check_rollouts_left(parse_args(argv=["--load", str(tmp_path), "--num-rollout", "10"]))
    check_rollouts_left(parse_args(argv=["--load", str(tmp_path), "--num-rollout", "11"]))  # one left: fine
    check_rollouts_left(parse_args(argv=["--load", str(tmp_path / "empty"), "--num-rollout", "1"]))  # fresh start


def test_an_explicit_start_beyond_the_last_rollout_is_refused():
    with pytest.raises(MilesConfigError, match="start at rollout 5, but --num-rollout is 5"):
        check_rollouts_left(parse_args(argv=["--start-rollout-id", "5", "--num-rollout", "5"]))


def test_a_bad_eval_file_is_named_as_the_eval_flag(embedded, tmp_path):
    _refused(_args(embedded, tmp_path, "--eval-prompt-data", str(tmp_path / "missing.jsonl")),
             "^--eval-prompt-data .*missing.jsonl")



def test_each_eval_config_dataset_is_read_and_named_before_ray_starts(embedded, tmp_path):
    config = tmp_path / "eval.yaml"
    config.write_text(f"eval:\n  datasets:\n    - {{name: ok, path: {embedded.eval_jsonl}}}\n"
                      f"    - {{name: gone, path: {tmp_path / 'gone.jsonl'}}}\n")
    _refused(_args(embedded, tmp_path, "--eval-config", str(config)),
             rf"^--eval-config {config} dataset 'gone' .*gone.jsonl'?: no such file")
    config.write_text(f"eval:\n  datasets:\n    - {{name: ok, path: {embedded.eval_jsonl}, rm_type: deepscaler}}\n")
    _refused(_args(embedded, tmp_path, "--eval-config", str(config)),
             rf"^--eval-config {config} dataset 'ok' \(rm_type 'deepscaler'\): --rm-type 'deepscaler' is not a built-in")
    config.write_text(f"eval:\n  datasets:\n    - {{name: ok, path: {embedded.eval_jsonl}, max_response_len: 60}}\n")
    # an eval dataset's own response budget counts against the model's 64 positions (every prompt is 5 tokens)
    _refused(_args(embedded, tmp_path, "--eval-config", str(config)),
             rf"^--eval-config {config} dataset 'ok' .* prompt 1 .* is 5 tokens, which with its max_response_len 60 "
             r"exceeds the model's 64 positions .* lower its max_response_len to 59 or less")
    _refused(_args(embedded, tmp_path, "--eval-max-response-len", "60"),
             r"^--eval-prompt-data .* is 5 tokens, which with --eval-max-response-len 60 ")
