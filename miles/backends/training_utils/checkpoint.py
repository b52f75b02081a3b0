"""Atomic checkpoints: HF-format weights plus the trainer state needed to resume exactly.

Layout of a save folder::

    SAVE/rollout_000009/actor/      config.json, model.safetensors, tokenizer files, trainer_state.pt
    SAVE/rollout_000009/critic/     (PPO; or under --critic-save)
    SAVE/latest_checkpointed_iteration.txt   "9", written last

Each role's folder is written to a temporary sibling and renamed into place in one step, and the ``latest`` marker
is replaced atomically only after every role finished (by the driver). A crash mid-save therefore leaves either
the previous checkpoint as latest or a complete new one, never a checkpoint that loads wrong.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from miles.models.hf import quiet_transformers_progress
from miles.utils.errors import MilesConfigError

LATEST_FILE = "latest_checkpointed_iteration.txt"
TRAINER_STATE_FILE = "trainer_state.pt"
TOKENIZER_FILE_PATTERNS = ("tokenizer*", "special_tokens_map.json", "vocab*", "merges.txt", "*.model", "chat_template*")


def rollout_dir(root: str, rollout_id: int) -> Path:
    return Path(root) / f"rollout_{rollout_id:06d}"


def save_role(root: str, rollout_id: int, role: str, model, trainer_state: dict, tokenizer_source: str | None,
              hf_state: dict | None = None) -> Path:
    """Write ``root/rollout_<id>/<role>`` atomically: HF weights (``hf_state`` when the caller has them already),
    tokenizer files, and ``trainer_state.pt``."""
    final = rollout_dir(root, rollout_id) / role
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{role}.tmp-", dir=final.parent))
    try:
        with quiet_transformers_progress():  # no "Writing model shards" bar per save in the middle of the run's bar
            if hf_state is None:
                model.save_pretrained(staging)
            else:
                model.save_pretrained(staging, hf_state=hf_state)
        if tokenizer_source is not None:
            _copy_tokenizer_files(Path(tokenizer_source), staging)
        torch.save(trainer_state, staging / TRAINER_STATE_FILE)
        _move_into_place(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def _move_into_place(staging: Path, final: Path) -> None:
    """Rename ``staging`` to ``final``. An existing ``final`` (the same rollout saved again) is moved aside first and
    restored if the rename fails, so the folder the latest marker names is never deleted before its replacement is
    in place."""
    if not final.exists():
        os.replace(staging, final)
        return
    backup = final.with_name(f".{final.name}.old-{os.getpid()}")
    os.replace(final, backup)
    try:
        os.replace(staging, final)
    except BaseException:
        os.replace(backup, final)
        raise
    shutil.rmtree(backup, ignore_errors=True)


def mark_latest(root: str, rollout_id: int) -> None:
    """Point ``root``'s latest marker at ``rollout_id``; call only after every role of that rollout is saved."""
    marker = Path(root) / LATEST_FILE
    staging = marker.with_name(f".{LATEST_FILE}.tmp-{os.getpid()}")
    staging.write_text(f"{rollout_id}\n")
    os.replace(staging, marker)


def latest_rollout_id(root: str) -> int | None:
    """The rollout id the latest marker names; ``None`` without a marker. A marker that is not a rollout id (a
    hand edit, a foreign file) is a ``MilesConfigError``: mark_latest never writes one."""
    marker = Path(root) / LATEST_FILE
    if not marker.is_file():
        return None
    with marker.open("rb") as file:
        text = file.read(64).decode("utf-8", errors="replace").strip()
    if not text.isdigit():
        raise MilesConfigError(
            f"{marker} reads {text!r}, not a rollout id, so the checkpoint in {root} cannot be found. Write the id of "
            f"a complete rollout_NNNNNN folder in it (e.g. 9 for rollout_000009), or load another folder."
        )
    return int(text)


def load_trainer_state(role_dir: Path, mmap: bool = False) -> dict:
    """``mmap=True`` maps the tensors instead of reading them: a cheap check that the file loads."""
    return torch.load(role_dir / TRAINER_STATE_FILE, weights_only=False, mmap=mmap)


def check_same_train_backend(trainer_state: dict, role_dir: Path, train_backend: str) -> None:
    """The weights are HF-format, readable by every backend, but the optimizer state is indexed by the saving
    backend's parameters (megatron fuses q/k/v and gate/up), so resuming needs the same ``--train-backend``."""
    saved = trainer_state.get("train_backend", "torch")  # checkpoints from before the flag are the torch backend's
    if saved != train_backend:
        raise MilesConfigError(
            f"--load: {role_dir} was saved with --train-backend {saved}, but this run uses --train-backend "
            f"{train_backend}; its optimizer state is laid out for {saved}'s parameters, so the run cannot resume "
            f"from it. Resume with --train-backend {saved}, or start a new run from its weights (the optimizer "
            f"starts afresh): --hf-checkpoint {role_dir.parent / 'actor'} without --load."
        )


def check_same_tensor_parallel_size(trainer_state: dict, role_dir: Path, tensor_parallel_size: int) -> None:
    """Each tensor-parallel rank's optimizer state is laid out for its own shards, so resuming needs the saving
    run's TP size; the data-parallel size may change (the replicas were identical)."""
    saved = trainer_state.get("tensor_model_parallel_size", 1)
    if saved != tensor_parallel_size:
        raise MilesConfigError(
            f"--load: {role_dir} was saved with --tensor-model-parallel-size {saved}, but this run uses "
            f"{tensor_parallel_size}; each tensor-parallel rank's optimizer state is laid out for its own shards, so "
            f"the run cannot resume from it. Resume with --tensor-model-parallel-size {saved} (any number of "
            f"data-parallel ranks), or start a new run from its weights: --hf-checkpoint {role_dir} without --load."
        )


def check_same_optimizer(trainer_state: dict, role_dir: Path, optimizer_name: str, num_param_groups: int) -> None:
    """The optimizer state is per parameter group (decay, no_decay) of one ``--optimizer``; a checkpoint of another
    optimizer, or one saved before the schedule's position was (a single Adam group), cannot be resumed exactly."""
    saved = trainer_state.get("optimizer_name")
    groups = len(trainer_state["optimizer"]["param_groups"])
    if saved is None or "optimizer_steps" not in trainer_state or groups != num_param_groups:
        raise MilesConfigError(
            f"--load: {role_dir} was saved before miles kept the optimizer's parameter groups and the learning-rate "
            f"schedule's position, so the run cannot resume it exactly. Start a new run from its weights (the "
            f"optimizer and schedule start afresh): --hf-checkpoint {role_dir} without --load."
        )
    if saved != optimizer_name:
        raise MilesConfigError(
            f"--load: {role_dir} was saved with --optimizer {saved}, whose state this run's optimizer cannot take. "
            f"Resume with --optimizer {saved}, or start a new run from its weights: --hf-checkpoint {role_dir} "
            "without --load."
        )


def _copy_tokenizer_files(source: Path, target: Path) -> None:
    for pattern in TOKENIZER_FILE_PATTERNS:
        for path in source.glob(pattern):
            if path.is_file():
                shutil.copy2(path, target / path.name)
