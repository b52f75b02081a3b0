"""Atomic checkpoints: HF-format weights plus the trainer state needed to resume exactly.

Layout of a save folder::

    SAVE/rollout_000009/actor/      config.json, model.safetensors, tokenizer files, trainer_state.pt
    SAVE/rollout_000009/actor/version_000011/   the weights of pushed version 11, when they are not the actor's
    SAVE/rollout_000009/critic/     (PPO; or under --critic-save)
    SAVE/rollout_000009/run_state.pt            the driver's: the rollout in flight, the prompt position, ...
    SAVE/latest_checkpointed_iteration.txt   "9", written last

``CHECKPOINT_FORMAT`` numbers the layout (docs/training.md, "Checkpoints and resume"): format 1 had no
``run_state.pt`` and no version tables; it still loads, and the resume is then not exact (one line says so).

Each role's folder is written to a temporary sibling and renamed into place in one step, and the ``latest`` marker
is replaced atomically only after every role finished (by the driver). A crash mid-save therefore leaves either
the previous checkpoint as latest or a complete new one, never a checkpoint that loads wrong.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from miles.config import corrections
from miles.models.hf import quiet_transformers_progress
from miles.utils.errors import MilesConfigError

logger = logging.getLogger("miles")

CHECKPOINT_FORMAT = 2  # 2: run_state.pt, the guard's version tables and the weights of the versions still live
LATEST_FILE = "latest_checkpointed_iteration.txt"
TRAINER_STATE_FILE = "trainer_state.pt"
RUN_STATE_FILE = "run_state.pt"
TOKENIZER_FILE_PATTERNS = ("tokenizer*", "special_tokens_map.json", "vocab*", "merges.txt", "*.model", "chat_template*")


def rollout_dir(root: str, rollout_id: int) -> Path:
    return Path(root) / f"rollout_{rollout_id:06d}"


def version_dir(role_dir: Path, version: int) -> Path:
    """Where a role's checkpoint keeps the weights of pushed ``version`` (a Hugging Face folder)."""
    return role_dir / f"version_{version:06d}"


def save_role(root: str, rollout_id: int, role: str, model, trainer_state: dict, tokenizer_source: str | None,
              hf_state: dict | None = None, version_weights: dict[int, dict] | None = None) -> Path:
    """Write ``root/rollout_<id>/<role>`` atomically: HF weights (``hf_state`` when the caller has them already),
    tokenizer files, ``trainer_state.pt``, and per pushed version in ``version_weights`` its HF weights."""
    final = rollout_dir(root, rollout_id) / role
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{role}.tmp-", dir=final.parent))
    try:
        with quiet_transformers_progress():  # no "Writing model shards" bar per save in the middle of the run's bar
            if hf_state is None:
                model.save_pretrained(staging)
            else:
                model.save_pretrained(staging, hf_state=hf_state)
            for version, weights in (version_weights or {}).items():
                model.save_pretrained(version_dir(staging, version), hf_state=weights)
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


def save_run_state(root: str, rollout_id: int, run_state: dict) -> None:
    """Write the driver's part of rollout ``rollout_id``'s checkpoint atomically, with ``CHECKPOINT_FORMAT``; call
    before ``mark_latest``."""
    final = rollout_dir(root, rollout_id) / RUN_STATE_FILE
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.with_name(f".{RUN_STATE_FILE}.tmp-{os.getpid()}")
    torch.save({"format": CHECKPOINT_FORMAT, **run_state}, staging)
    os.replace(staging, final)


def load_run_state(root: str, rollout_id: int) -> dict | None:
    """The driver's part of a checkpoint; ``None`` for a format-1 checkpoint (it has none). A checkpoint of a newer
    format than this miles reads is refused."""
    path = rollout_dir(root, rollout_id) / RUN_STATE_FILE
    if not path.is_file():
        return None
    state = torch.load(path, weights_only=False)
    if state["format"] > CHECKPOINT_FORMAT:
        raise MilesConfigError(
            f"--load: {path} has checkpoint format {state['format']}, newer than this miles' {CHECKPOINT_FORMAT}: it "
            "cannot be read. Resume with the miles that saved it, or start a new run from its weights: "
            f"--hf-checkpoint {path.parent / 'actor'} without --load."
        )
    return state


def inexact_resume_reason(run_state: dict | None, driver: str, update_weights_interval: int, keeps_snapshots: bool,
                          start_rollout_id: int | None, saved_rollout_id: int) -> str | None:
    """Why a resume from this checkpoint cannot continue the straight run exactly, or None when it can."""
    if run_state is None:
        return (f"it was saved with checkpoint format 1 (before format {CHECKPOINT_FORMAT}), which holds no rollout in "
                "flight and no weight-version tables")
    if start_rollout_id is not None and start_rollout_id != saved_rollout_id + 1:
        return f"--start-rollout-id {start_rollout_id} is not the rollout after the saved one ({saved_rollout_id + 1})"
    if driver != run_state["driver"]:
        return f"it was saved by {run_state['driver']}.py, and this is {driver}.py"
    if driver == "train_async" and update_weights_interval != run_state["update_weights_interval"]:
        return (f"it was saved with --update-weights-interval {run_state['update_weights_interval']}, and this run "
                f"uses {update_weights_interval}")
    if keeps_snapshots != run_state["keeps_snapshots"]:  # the snapshots of the versions in flight are in it, or not
        return (f"it was saved {'with' if run_state['keeps_snapshots'] else 'without'} a weight snapshot per pushed "
                f"version (--keep-old-actor), and this run keeps {'them' if keeps_snapshots else 'none'}")
    if driver == "train_async" and run_state["in_flight"] is None:
        return "no rollout was in flight at the save (it was the last rollout of the saving run, or it failed)"
    return None


def resume_run_state(args, driver: str) -> tuple[dict | None, bool]:
    """(the saved run state, whether the resume continues the straight run exactly) for ``--load``; (None, False)
    without a checkpoint to load or with a format-1 one. An inexact resume is said in one line: its first rollout
    is generated with the loaded weights (d = 0), and the weight versions continue from the saved count."""
    saved = latest_rollout_id(args.load) if args.load else None
    if saved is None:
        return None, False
    run_state = load_run_state(args.load, saved)
    keeps_snapshots = corrections.in_effect(args).keeps_snapshots
    reason = inexact_resume_reason(run_state, driver, args.update_weights_interval, keeps_snapshots,
                                   args.start_rollout_id, saved)
    if reason is not None:
        logger.warning("--load %s: this resume is not exact (%s): its first rollout is generated with the loaded "
                       "weights (d = 0) and the weight versions continue from the saved count.", args.load, reason)
    return run_state, reason is None


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
