"""The train processes: the actor (policy) and, for PPO, the critic. Plain classes; ``miles.ray`` makes them remote.

Per rollout the actor computes the ratio denominator ("old") once, before its first optimizer step, by the mode the
flags choose (DESIGN.md §3), then takes ``--num-steps-per-rollout`` optimizer steps over micro-batches whose losses
are already scaled by the whole step's divisor, so the gradient does not depend on micro-batching.
"""

from __future__ import annotations

import random
import resource
import time
from collections.abc import Callable

import torch

from miles.backends.torch_backend import checkpoint
from miles.backends.torch_backend.models import response_log_probs, response_values
from miles.backends.torch_backend.snapshots import WeightSnapshotStore
from miles.backends.training_utils.advantages import compute_advantages_and_returns
from miles.backends.training_utils.loss import (
    LossConfig,
    policy_loss,
    step_divisor,
    value_loss,
)
from miles.utils.fingerprint import weights_fingerprint
from miles.utils.hf import load_causal_lm, load_value_model
from miles.utils.types import RolloutBatch, Sample

Tensors = list[torch.Tensor]


def _as_tensors(rows, dtype=torch.float32) -> Tensors:
    return [torch.tensor(row, dtype=dtype) for row in rows]


def _sample_version(sample: Sample, rollout_id: int) -> int:
    if len(set(sample.weight_versions)) != 1:
        raise ValueError(
            f"rollout {rollout_id}, sample {sample.index}: expected one weight version, got {sample.weight_versions}"
        )
    return sample.weight_versions[0]


def run_optimizer_steps(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_masks: Tensors,
    global_batch_size: int,
    micro_batch_size: int,
    per_token: bool,
    clip_grad: float,
    micro_batch_loss: Callable[[list[int], float], tuple[torch.Tensor, dict[str, float]]],
) -> dict[str, float]:
    """Optimizer steps over consecutive global batches of sample indices, accumulating micro-batch gradients.

    ``micro_batch_loss(indices, divisor)`` returns a loss already divided by the step's divisor. Metrics are
    averaged over samples (each micro-batch's metrics weighted by its size); ``grad_norm`` over steps.
    """
    num_samples = len(loss_masks)
    totals: dict[str, float] = {}
    grad_norms = []
    for step_start in range(0, num_samples, global_batch_size):
        step = list(range(step_start, min(step_start + global_batch_size, num_samples)))
        divisor = step_divisor([loss_masks[i] for i in step], per_token)
        optimizer.zero_grad(set_to_none=True)
        for micro_start in range(0, len(step), micro_batch_size):
            micro = step[micro_start : micro_start + micro_batch_size]
            loss, metrics = micro_batch_loss(micro, divisor)
            loss.backward()
            for name, value in metrics.items():
                totals[name] = totals.get(name, 0.0) + value * len(micro)
        grad_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)))
        optimizer.step()
    averaged = {name: total / num_samples for name, total in totals.items()}
    averaged["grad_norm"] = sum(grad_norms) / len(grad_norms)
    return averaged


class _TrainProcess:
    """What the actor and the critic share: threads, seeding, optimizer steps, checkpoints."""

    role = ""

    def __init__(self, args, model: torch.nn.Module, lr: float, num_threads: int) -> None:
        torch.set_num_threads(num_threads)
        self.args = args
        self.model = model
        self.model.train()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)

    def save(self, root: str, rollout_id: int, extra_state: dict | None = None) -> str:
        state = {
            "rollout_id": rollout_id,
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            **(extra_state or {}),
        }
        return str(checkpoint.save_role(root, rollout_id, self.role, self.model, state, self.args.hf_checkpoint))

    def _load_trainer_state(self, root: str) -> dict | None:
        rollout_id = checkpoint.latest_rollout_id(root)
        if rollout_id is None:
            return None
        state = checkpoint.load_trainer_state(checkpoint.rollout_dir(root, rollout_id) / self.role)
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        return state

    def state_for_test(self) -> dict:
        """Weights and optimizer state as plain tensors (resume tests compare them)."""
        return {"model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
                "optimizer": self.optimizer.state_dict()}


def _load_dir(root: str | None, role: str, fallback: str) -> str:
    rollout_id = checkpoint.latest_rollout_id(root) if root else None
    return fallback if rollout_id is None else str(checkpoint.rollout_dir(root, rollout_id) / role)


class PolicyTrainer(_TrainProcess):
    role = "actor"

    def __init__(self, args, num_threads: int = 1) -> None:
        torch.manual_seed(args.seed)
        super().__init__(args, load_causal_lm(_load_dir(args.load, "actor", args.hf_checkpoint)), args.lr, num_threads)
        self.loss_config = LossConfig.from_args(args)
        self.ref_model = self._load_ref_model(args)
        self.snapshots = WeightSnapshotStore() if args.keep_old_actor else None
        self.weight_version = 0  # pushes so far; version v is the v-th push (DESIGN.md §4)
        self.version_to_rollouts_trained: dict[int, int] = {}

    @staticmethod
    def _load_ref_model(args):
        if not (args.use_kl_loss or args.kl_coef != 0):
            return None
        ref = load_causal_lm(args.ref_load or args.hf_checkpoint)
        ref.eval().requires_grad_(False)
        return ref

    def init(self) -> int:
        """Load ``--load`` if it has a checkpoint; return the first rollout id to train."""
        state = self._load_trainer_state(self.args.load) if self.args.load else None
        if state is None:
            return self.args.start_rollout_id or 0
        self.weight_version = state["weight_version"]
        return self.args.start_rollout_id if self.args.start_rollout_id is not None else state["rollout_id"] + 1

    def save(self, root: str, rollout_id: int, extra_state: dict | None = None) -> str:
        # Snapshots are not saved: a resumed run regenerates its first rollout with the loaded weights (d = 0).
        return super().save(root, rollout_id, {"weight_version": self.weight_version, **(extra_state or {})})

    def export_weights(self, rollouts_trained: int) -> dict:
        """Weights for the engines as the next version; with --keep-old-actor, also snapshot them."""
        self.weight_version += 1
        state_dict = {name: tensor.detach().clone() for name, tensor in self.model.state_dict().items()}
        fingerprint = weights_fingerprint(state_dict)
        self.version_to_rollouts_trained[self.weight_version] = rollouts_trained
        if self.snapshots is not None:
            self.snapshots.add_pushed(self.weight_version, state_dict, fingerprint)
        return {"version": self.weight_version, "fingerprint": fingerprint, "state_dict": state_dict}

    @torch.no_grad()
    def _forward_log_probs(self, model, samples: list[Sample]) -> Tensors:
        was_training = model.training
        model.eval()
        try:
            return response_log_probs(model, samples, self.args.rollout_temperature)[0]
        finally:
            model.train(was_training)

    def _recomputed_old_log_probs(self, rollout_id: int, samples: list[Sample], versions: list[int]) -> Tensors | None:
        """The recompute pass: snapshot weights (--keep-old-actor), the current actor, or skipped."""
        if self.snapshots is not None:
            snapshot = self.snapshots.take_for_training(max(versions), rollout_id)
            if min(versions) != snapshot.version:
                raise ValueError(f"rollout {rollout_id} mixes weight versions {sorted(set(versions))}")
            live_state = {name: tensor.clone() for name, tensor in self.model.state_dict().items()}
            self.model.load_state_dict(snapshot.state_dict)
            try:
                return self._forward_log_probs(self.model, samples)
            finally:
                self.model.load_state_dict(live_state)
        if self.args.use_rollout_logprobs and not self.args.get_mismatch_metrics:
            return None  # the engine's log-probs are the denominator: no recompute pass
        return self._forward_log_probs(self.model, samples)

    def train(self, rollout_id: int, rollout: RolloutBatch, values: Tensors | None = None) -> dict[str, float]:
        start = time.perf_counter()
        samples = rollout.samples
        versions = [_sample_version(sample, rollout_id) for sample in samples]
        staleness = [rollout_id - self.version_to_rollouts_trained[v] for v in versions]
        loss_masks = _as_tensors(sample.loss_mask for sample in samples)
        rollout_log_probs = _as_tensors(sample.rollout_log_probs for sample in samples)
        old_log_probs = self._recomputed_old_log_probs(rollout_id, samples, versions)  # once, before any step
        ref_log_probs = self._forward_log_probs(self.ref_model, samples) if self.ref_model is not None else None
        kl = None
        if self.args.kl_coef != 0:
            base = old_log_probs if old_log_probs is not None else rollout_log_probs
            kl = [b - r for b, r in zip(base, ref_log_probs, strict=True)]
        advantages, _ = compute_advantages_and_returns(
            self.args.advantage_estimator, [sample.reward for sample in samples], loss_masks, values,
            group_size=self.args.n_samples_per_prompt, gamma=self.args.gamma, lambd=self.args.lambd,
            std_normalization=not self.args.disable_grpo_std_normalization,
            normalize=self.args.normalize_advantages, kl=kl, kl_coef=self.args.kl_coef,
        )
        batch = {"loss_masks": loss_masks, "advantages": advantages, "old_log_probs": old_log_probs,
                 "rollout_log_probs": rollout_log_probs, "ref_log_probs": ref_log_probs}

        def micro_batch_loss(indices: list[int], divisor: float):
            log_probs, entropy = response_log_probs(
                self.model, [samples[i] for i in indices], self.args.rollout_temperature, with_entropy=True
            )
            return policy_loss(self.loss_config, _select(batch, indices), log_probs, entropy, divisor)

        metrics = run_optimizer_steps(
            self.model, self.optimizer, loss_masks, self.args.global_batch_size, self.args.micro_batch_size,
            self.args.calculate_per_token_loss, self.args.clip_grad, micro_batch_loss,
        )
        metrics = {f"train/{name}": value for name, value in metrics.items()}
        metrics.update(_staleness_metrics(staleness, versions))
        if old_log_probs is not None:
            metrics["off_policy/old_rollout_abs_diff_max"] = max(
                float((o - r).abs().max()) for o, r in zip(old_log_probs, rollout_log_probs, strict=True)
            )
        if self.snapshots is not None:
            metrics["off_policy/num_snapshots"] = float(len(self.snapshots))
        metrics["perf/train_s"] = time.perf_counter() - start
        metrics["perf/actor_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return metrics


def _select(batch: dict, indices: list[int]) -> dict:
    return {key: (None if rows is None else [rows[i] for i in indices]) for key, rows in batch.items()}


def _staleness_metrics(staleness: list[int], versions: list[int]) -> dict[str, float]:
    return {
        "off_policy/staleness_mean": sum(staleness) / len(staleness),
        "off_policy/staleness_max": float(max(staleness)),
        "off_policy/behavior_version": float(max(versions)),
    }


class ValueTrainer(_TrainProcess):
    role = "critic"

    def __init__(self, args, num_threads: int = 1) -> None:
        torch.manual_seed(args.seed + 1)
        fallback = args.hf_checkpoint
        super().__init__(args, load_value_model(_load_dir(args.critic_load, "critic", fallback)), args.critic_lr, num_threads)
        self.loss_config = LossConfig.from_args(args)

    def init(self) -> None:
        if self.args.critic_load:
            self._load_trainer_state(self.args.critic_load)

    @torch.no_grad()
    def compute_values(self, rollout: RolloutBatch) -> Tensors:
        """V_t of every response token under the current critic, before this rollout's steps (the "old" values)."""
        self.model.eval()
        try:
            return response_values(self.model, rollout.samples)
        finally:
            self.model.train()

    def train(self, rollout_id: int, rollout: RolloutBatch, old_values: Tensors) -> dict[str, float]:
        samples = rollout.samples
        loss_masks = _as_tensors(sample.loss_mask for sample in samples)
        _, returns = compute_advantages_and_returns(
            "ppo", [sample.reward for sample in samples], loss_masks, old_values,
            group_size=self.args.n_samples_per_prompt, gamma=self.args.gamma, lambd=self.args.lambd,
            std_normalization=True, normalize=False,
        )
        batch = {"loss_masks": loss_masks, "returns": returns, "old_values": old_values}

        def micro_batch_loss(indices: list[int], divisor: float):
            values = response_values(self.model, [samples[i] for i in indices])
            return value_loss(self.loss_config, _select(batch, indices), values, divisor)

        metrics = run_optimizer_steps(
            self.model, self.optimizer, loss_masks, self.args.global_batch_size, self.args.micro_batch_size,
            self.args.calculate_per_token_loss, self.args.clip_grad, micro_batch_loss,
        )
        return {f"critic/{name}": value for name, value in metrics.items()}
