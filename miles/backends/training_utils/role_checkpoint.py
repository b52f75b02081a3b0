"""A train role's own checkpoint: its weights, optimizer state, schedule position and random state, saved and
loaded as the train process needs them (the files themselves: ``checkpoint.py``)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from miles.backends.training_utils import checkpoint
from miles.backends.training_utils.train_model import TrainModel


@dataclass(frozen=True)
class CheckpointConfig:
    """The flags a role's checkpoint reads, built once from ``args``."""

    role: str  # "actor" or "critic": the role's folder in a rollout's checkpoint
    load: str | None  # --load (actor) or --critic-load
    hf_checkpoint: str  # the weights without a checkpoint to load, and the tokenizer files a save copies
    train_backend: str  # the optimizer state is laid out for its parameters
    optimizer: str
    tensor_parallel_size: int
    start_rollout_id: int | None

    @classmethod
    def from_args(cls, args, role: str) -> CheckpointConfig:
        return cls(role, args.load if role == "actor" else args.critic_load, args.hf_checkpoint, args.train_backend,
                   args.optimizer, args.tensor_model_parallel_size, args.start_rollout_id)

    def role_dir(self, rollout_id: int) -> Path:
        """The role's folder in the checkpoint of ``rollout_id`` under ``load``."""
        return checkpoint.rollout_dir(self.load, rollout_id) / self.role

    def model_folder(self) -> str:
        """Where the role's weights load from: the latest checkpoint under ``load``, else ``hf_checkpoint``."""
        rollout_id = checkpoint.latest_rollout_id(self.load) if self.load else None
        return self.hf_checkpoint if rollout_id is None else str(self.role_dir(rollout_id))

    def first_rollout(self, state: dict | None) -> int:
        """The first rollout to train: --start-rollout-id, else the one after the loaded checkpoint's, else 0."""
        if self.start_rollout_id is not None:
            return self.start_rollout_id
        return 0 if state is None else state["rollout_id"] + 1


def save_role_state(config: CheckpointConfig, root: str, rollout_id: int, model: TrainModel,
                    optimizer: torch.optim.Optimizer, extra_state: dict,
                    version_weights: dict[int, dict] | None = None) -> str | None:
    """One checkpoint per role, written by tensor-parallel rank 0 after every TP rank gathered its shards of the
    weights and optimizer state (call it on every TP rank of one data-parallel replica). ``version_weights``: HF
    weights of pushed versions to keep beside the role's own (the actor's)."""
    optimizers = model.gather_over_tensor_parallel(optimizer.state_dict())  # each is its shards'
    # Sharded weights are gathered here, where every tensor-parallel rank takes part; whole ones are saved as is.
    hf_state = model.hf_state_dict() if len(optimizers) > 1 else None
    if model.tensor_parallel_rank != 0:
        return None
    state = {
        "rollout_id": rollout_id,
        "train_backend": config.train_backend,
        "optimizer": optimizers[0],
        "optimizer_name": config.optimizer,
        "tensor_model_parallel_size": len(optimizers),
        **({"tensor_parallel_optimizers": optimizers} if len(optimizers) > 1 else {}),
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        **extra_state,
    }
    return str(checkpoint.save_role(root, rollout_id, config.role, model, state, config.hf_checkpoint, hf_state,
                                    version_weights))


def load_role_state(config: CheckpointConfig, model: TrainModel, optimizer: torch.optim.Optimizer) -> dict | None:
    """The latest checkpoint's trainer state under ``config.load`` (None without one), after checking it was saved
    by the same backend, tensor-parallel size and optimizer, and loading this rank's optimizer state and the RNGs."""
    rollout_id = checkpoint.latest_rollout_id(config.load) if config.load else None
    if rollout_id is None:
        return None
    role_dir = config.role_dir(rollout_id)
    state = checkpoint.load_trainer_state(role_dir)
    checkpoint.check_same_train_backend(state, role_dir, config.train_backend)
    checkpoint.check_same_tensor_parallel_size(state, role_dir, config.tensor_parallel_size)
    optimizers = state.get("tensor_parallel_optimizers", [state["optimizer"]])
    checkpoint.check_same_optimizer(state, role_dir, config.optimizer, len(optimizer.param_groups))
    optimizer.load_state_dict(optimizers[model.tensor_parallel_rank])
    restore_rng(state)
    return state


def restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
