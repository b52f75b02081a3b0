"""The train processes: the actor (policy) and, for PPO, the critic. Plain classes; ``miles.ray`` makes them remote.

One implementation for every training backend: the backend only supplies the model (``TrainModel``), loaded by
``ModelSpec`` as ``--train-backend`` says. A process keeps the step; its collaborators, each with a configuration
built once from ``args``, do the rest: the optimizer steps (``optimizer_steps.StepConfig``), the role's checkpoint
(``role_checkpoint``), and for the actor the pushes (``weight_export.WeightExporter``, with the snapshots), the
guard's per-batch check (``miles.guard.batch.BatchGuard``), the advantages (``advantages.AdvantageConfig``) and
the loss (``loss.LossConfig``, which asks the corrections table's rows in effect).

Per rollout the actor computes the ratio denominator ("old") once, before its first optimizer step, where the
rows in effect say (docs/design.md §3), then takes ``--num-steps-per-rollout`` optimizer steps over micro-batches
whose losses are already scaled by the whole step's divisor, so the gradient does not depend on micro-batching.
"""

from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass

import torch

from miles.backends import ModelSpec
from miles.backends.training_utils.advantages import AdvantageConfig, critic_returns, policy_advantages
from miles.backends.training_utils.loss import LossConfig, policy_loss, value_loss
from miles.backends.training_utils.loss_hub.mismatch import MismatchConfig, policy_vs_behavior, rollout_report
from miles.backends.training_utils.optimizer import OptimizerConfig, build_optimizer
from miles.backends.training_utils.optimizer_steps import StepConfig, Tensors, no_grad_passes, run_optimizer_steps
from miles.backends.training_utils.parallel import process_parallel_state, set_parallel_state
from miles.backends.training_utils.role_checkpoint import (
    CheckpointConfig,
    load_role_state,
    restore_rng,
    save_role_state,
)
from miles.backends.training_utils.snapshots import verified_snapshot
from miles.backends.training_utils.train_model import TrainModel
from miles.backends.training_utils.weight_export import WeightExporter
from miles.config import corrections
from miles.config.lr_schedule import learning_rate, schedule_for_role
from miles.guard import off_policy
from miles.guard.batch import BatchGuard, GuardConfig
from miles.ranks.data_parallel import data_parallel_rank
from miles.utils.errors import DivergenceError
from miles.utils.types import RolloutBatch, Sample


def _as_tensors(rows, dtype=torch.float32) -> Tensors:
    """One 1-D tensor per row, split from one tensor: one conversion per rollout, not one per sample."""
    rows = list(rows)
    return list(torch.tensor([value for row in rows for value in row], dtype=dtype).split([len(r) for r in rows]))


class _TrainProcess:
    """What the actor and the critic share: threads, the model, optimizer steps and schedule, checkpoints."""

    role = ""

    def __init__(self, args, model: TrainModel, checkpoints: CheckpointConfig | None = None) -> None:
        self.model = model
        self.model.module.train()
        self.steps = StepConfig.from_args(args)
        if self.steps.deterministic:  # --deterministic-mode, as upstream's train processes set it up
            torch.use_deterministic_algorithms(True, warn_only=False)
        self.checkpoints = checkpoints or CheckpointConfig.from_args(args, self.role)
        self.schedule = schedule_for_role(args, self.role)
        self.optimizer = build_optimizer(self.model.module.named_parameters(), OptimizerConfig.from_args(args),
                                         self.schedule.max_lr)
        self.optimizer_steps = 0  # iterations so far, over the whole run (lr_schedule's module docstring)
        self.trained_rollout: int | None = None  # the rollout whose training the live weights hold; None part-way
        # set once the model (and its process groups) exist; the loss's hooks and cp_utils read it too
        state = process_parallel_state(args.tensor_model_parallel_size)
        set_parallel_state(state)
        self.data_parallel = data_parallel_rank(state)

    @staticmethod
    def _load_model(spec: ModelSpec, role: str, folder: str, num_threads: int) -> TrainModel:
        """The role's model, after pinning this process's torch threads (loading runs torch ops)."""
        torch.set_num_threads(num_threads)
        return spec.load_trained(role, folder)

    def trained_rollout_id(self) -> int | None:
        """The rollout whose training the live weights hold (None: part-way through one), for a save on a stop."""
        return self.trained_rollout

    def _optimizer_steps(self, rollout_id: int, loss_masks: Tensors, micro_batch_loss,
                         lengths: list[int] | None = None) -> dict[str, float]:
        """``run_optimizer_steps`` on this process's model and flags, keeping ``trained_rollout`` true.
        ``lengths``: tokens per sample, read by --use-dynamic-batch-size and --balance-data."""
        previous, self.trained_rollout = self.trained_rollout, None
        steps = self.steps
        try:
            metrics = run_optimizer_steps(
                self.model.clip_grad_norm, self.optimizer, loss_masks, steps.global_batch_size,
                steps.micro_batch_size, steps.per_token, steps.clip_grad, micro_batch_loss,
                where=f"rollout {rollout_id}, {self.role}", data_parallel=self.data_parallel,
                learning_rate=lambda step: learning_rate(self.optimizer_steps + step, self.schedule),
                lengths=lengths, max_tokens_per_micro_batch=steps.max_tokens_per_micro_batch,
                balance_data=steps.balance_data,
            )
        except DivergenceError as error:
            if not error.weights_changed:
                self.trained_rollout = previous
            raise
        self.trained_rollout = rollout_id
        self.optimizer_steps += math.ceil(len(loss_masks) / steps.global_batch_size)
        return metrics

    def save(self, root: str, rollout_id: int, extra_state: dict | None = None,
             version_weights: dict[int, dict] | None = None) -> str | None:
        """One checkpoint per role: data-parallel replicas are identical, so only DP rank 0's tensor-parallel ranks
        take part (``save_role_state``)."""
        if not self.data_parallel.writes_checkpoint:
            return None
        state = {"optimizer_steps": self.optimizer_steps, **(extra_state or {})}  # the schedule's position
        return save_role_state(self.checkpoints, root, rollout_id, self.model, self.optimizer, state, version_weights)

    def _load_trainer_state(self) -> dict | None:
        state = load_role_state(self.checkpoints, self.model, self.optimizer)
        if state is not None:
            self.optimizer_steps = state["optimizer_steps"]
            self.trained_rollout = state["rollout_id"]
        return state

    def model_and_optimizer_state(self) -> dict:
        """Copies of the weights and the optimizer state (to inspect a loaded or trained process)."""
        return {"model": self.model.native_state_dict(), "optimizer": self.optimizer.state_dict()}


@dataclass
class _PreparedRollout:
    """What ``PolicyTrainer.prepare`` computed once for a rollout, before its first optimizer step."""

    rollout_id: int
    samples: list[Sample]
    batch: dict


class PolicyTrainer(_TrainProcess):
    role = "actor"

    def __init__(self, args, num_threads: int = 1) -> None:
        self.models = ModelSpec.from_args(args)
        checkpoints = CheckpointConfig.from_args(args, self.role)
        super().__init__(args, self._load_model(self.models, self.role, checkpoints.model_folder(), num_threads),
                         checkpoints)
        self.loss_config = LossConfig.from_args(args)
        self.corrections = self.loss_config.corrections  # the corrections table's rows this run chose
        self.advantages = AdvantageConfig.from_args(args)
        self.mismatch = MismatchConfig.from_args(args)
        self.guard = BatchGuard(GuardConfig.from_args(args))
        # the engines' weights are kept for a save only while the actor trains past them (an interval above 1)
        self.exporter = WeightExporter(self.model, self.corrections.keeps_snapshots,
                                       keeps_engine_weights=bool(args.save) and args.update_weights_interval > 1)
        self.ref_model = self._load_reference()
        self.temperature = args.rollout_temperature
        self.recompute_for_metrics = args.get_mismatch_metrics  # a recompute pass even when the engine's is "old"
        self.num_critic_only_steps = args.num_critic_only_steps
        self._prepared: _PreparedRollout | None = None

    def _load_reference(self) -> TrainModel | None:
        if self.models.reference_folder is None:
            return None
        reference = self.models.load_frozen(self.models.reference_folder)
        reference.module.eval().requires_grad_(False)
        return reference

    @property
    def weight_version(self) -> int:
        return self.exporter.version

    def init(self, exact_resume: bool = False) -> int:
        """Load ``--load`` if it has a checkpoint; return the first rollout id to train. ``exact_resume``: the run
        continues the straight run (``checkpoint.resume_run_state``), so the guard's version tables, the snapshots
        and the engines' weights are restored as well, and the start-up push re-pushes the engines' version."""
        state = self._load_trainer_state()
        if state is None:
            return self.checkpoints.first_rollout(None)
        self.exporter.version = state["weight_version"]
        if exact_resume:
            self.exporter.restore(state, self.checkpoints.role_dir(state["rollout_id"]), self.models.load_frozen)
            restore_rng(state)  # loading a model seeds torch
        return self.checkpoints.first_rollout(state)

    def save(self, root: str, rollout_id: int, extra_state: dict | None = None) -> str:
        """The checkpoint also holds the guard's tables and the weights of the pushed versions still live (the
        engines', the SNAPSHOT row's) that are not the actor's own, so a resume continues exactly."""
        tables, weights = self.exporter.saved_state(rollout_id)
        return super().save(root, rollout_id, {**tables, **(extra_state or {})}, weights)

    def export_weights(self, rollouts_trained: int, after_training: bool = False) -> dict:
        """Weights for the engines as the next version, with their fingerprint (``WeightExporter.push``).

        ``after_training``: this push follows the training of rollout ``rollouts_trained - 1``. The driver submits
        it together with that ``train`` (Ray runs them in order), so it checks here that the training succeeded:
        weights that do not hold it are never pushed (that failure is the run's error; this one only follows it).
        The start-up push of an exact resume pushes the engines' saved version again instead.
        """
        if after_training and not self.exporter.resuming and self.trained_rollout != rollouts_trained - 1:
            raise RuntimeError(f"weight version {self.exporter.version + 1} is not pushed: the weights do not hold "
                               f"the training of rollout {rollouts_trained - 1}, which failed (that error is the cause)")
        try:
            return self.exporter.push(rollouts_trained)
        except DivergenceError:
            self.trained_rollout = None  # non-finite weights are no rollout's to save
            raise

    def _forward_log_probs(self, model: TrainModel, samples: list[Sample]) -> Tensors:
        with model.eval_mode():
            return no_grad_passes(self.steps.max_tokens_per_no_grad_pass, samples,
                                  lambda part: model.response_log_probs(
                                      part, self.temperature, chunk_size=self.steps.log_probs_chunk_size)[0])

    def _snapshot_log_probs(self, rollout_id: int, samples: list[Sample]) -> Tensors:
        """The SNAPSHOT denominator: a recompute with the weights of the version that generated the rollout."""
        with self.guard.timed():
            snapshot = verified_snapshot(
                self.exporter.snapshots, self.model, rollout_id, samples[0].weight_versions[0],
                {(s.weight_versions[0], s.weight_fingerprint) for s in samples}, self.exporter.pushed_fingerprints)
        with self.model.swapped_weights(snapshot.state_dict):
            return self._forward_log_probs(self.model, samples)

    def _recomputed_old_log_probs(self, rollout_id: int, samples: list[Sample]) -> Tensors | None:
        """The recompute pass where the rows in effect put "old": a snapshot, the current actor, or none."""
        denominator = self.corrections.denominator
        if denominator == corrections.SNAPSHOT:
            return self._snapshot_log_probs(rollout_id, samples)
        if denominator == corrections.ROLLOUT and not self.recompute_for_metrics:
            return None  # the engine's log-probs are the denominator: no recompute pass
        return self._forward_log_probs(self.model, samples)

    def prepare(self, rollout_id: int, rollout: RolloutBatch, expected_staleness: int, values: Tensors | None = None):
        """Guard the rollout and compute, once and before any optimizer step, its denominator and advantages.

        Raises ``OffPolicyGuardError`` before any weight changes; returns the rollout's off-policy report.
        """
        start, samples = time.perf_counter(), rollout.samples
        staleness = self.guard.check_provenance(rollout_id, samples, expected_staleness,
                                                self.exporter.version_to_rollouts_trained,
                                                self.exporter.pushed_fingerprints)
        loss_masks = _as_tensors(sample.loss_mask for sample in samples)
        rollout_log_probs = _as_tensors(sample.rollout_log_probs for sample in samples)
        old_log_probs = self._recomputed_old_log_probs(rollout_id, samples)
        report = {"staleness_mean": sum(staleness) / len(staleness), "staleness_max": float(max(staleness)),
                  "behavior_version": float(samples[0].weight_versions[0]), "correction": self.corrections.label}
        trained = trained_tokens(loss_masks, old_log_probs, rollout_log_probs) if old_log_probs is not None else None
        if trained is not None:  # only the tokens the loss trains: a tool's output (loss mask 0) is no one's action
            old_trained, rollout_trained, ones = trained
            with self.guard.timed():  # the comparison check_denominator reads
                report.update(off_policy.denominator_abs_diff(old_trained, rollout_trained))
            report.update(rollout_report(self.mismatch, old_trained, rollout_trained, ones))
            self.guard.check_denominator(rollout_id, report)
        if self.exporter.snapshots is not None:
            report["num_snapshots"] = float(len(self.exporter.snapshots))
        ref_log_probs = self._forward_log_probs(self.ref_model, samples) if self.ref_model is not None else None
        advantages = policy_advantages(self.advantages, [sample.reward for sample in samples], loss_masks, values,
                                       old_log_probs, rollout_log_probs, ref_log_probs)
        batch = {"loss_masks": loss_masks, "old_log_probs": old_log_probs, "rollout_log_probs": rollout_log_probs,
                 "ref_log_probs": ref_log_probs, "total_lengths": [len(sample.tokens) for sample in samples],
                 "advantages": advantages}
        metrics = {f"off_policy/{name}": value for name, value in report.items()}
        # the checks of this rollout and of its push
        metrics["perf/guard_s"] = self.guard.seconds + self.exporter.take_guard_seconds()
        metrics["perf/prepare_s"] = time.perf_counter() - start
        self._prepared = _PreparedRollout(rollout_id, samples, batch)
        if rollout_id < self.num_critic_only_steps:
            self.trained_rollout = rollout_id  # a critic-only rollout leaves the actor's weights as they are
        return metrics

    def train(self, rollout_id: int) -> dict[str, float]:
        """The optimizer steps on the rollout ``prepare`` checked; also measures policy vs behavior at step one.

        The driver submits this together with ``prepare`` (Ray runs them in order); if ``prepare`` failed (the
        guard refused the rollout), there is no prepared rollout and this fails too, leaving the weights as they
        are."""
        prepared, self._prepared = self._prepared, None
        if prepared is None or prepared.rollout_id != rollout_id:
            raise RuntimeError(f"rollout {rollout_id} is not trained: its prepare failed (that error is the cause)")
        start = time.perf_counter()
        samples, batch = prepared.samples, prepared.batch
        first_step = set(range(min(self.steps.global_batch_size, len(samples))))
        first_step_log_probs: dict[int, torch.Tensor] = {}

        def micro_batch_loss(indices: list[int], divisor: float):
            log_probs, entropy = self.model.response_log_probs(
                [samples[i] for i in indices], self.temperature, with_entropy=True,
                chunk_size=self.steps.log_probs_chunk_size)
            for i, lp in zip(indices, log_probs, strict=True):
                if i in first_step and i not in first_step_log_probs:
                    first_step_log_probs[i] = lp.detach()
            return policy_loss(self.loss_config, _select(batch, indices), log_probs, entropy, divisor)

        metrics = self._optimizer_steps(rollout_id, batch["loss_masks"], micro_batch_loss, batch["total_lengths"])
        metrics = {f"train/{name}": value for name, value in metrics.items()}
        first_step_log_probs = self.data_parallel.merged(first_step_log_probs)  # each rank saw its slice
        first = sorted(first_step_log_probs)
        trained = trained_tokens([batch["loss_masks"][i] for i in first], [first_step_log_probs[i] for i in first],
                                 [batch["rollout_log_probs"][i] for i in first])
        if trained is not None:
            metrics.update({f"off_policy/{name}": value for name, value in policy_vs_behavior(*trained[:2]).items()})
        metrics["perf/train_s"] = time.perf_counter() - start
        metrics["perf/actor_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return metrics


def trained_tokens(loss_masks: Tensors, *per_token: Tensors) -> tuple[Tensors, ...] | None:
    """Each of ``per_token`` (one 1-D tensor per sample) kept at the tokens with loss mask 1, samples without one
    dropped, and their all-ones masks; None when no token is trained."""
    kept = [mask != 0 for mask in loss_masks]
    samples = [i for i, keep in enumerate(kept) if bool(keep.any())]
    if not samples:
        return None
    return (*([values[i][kept[i]] for i in samples] for values in per_token),
            [torch.ones(int(kept[i].sum())) for i in samples])


def _select(batch: dict, indices: list[int]) -> dict:
    return {key: (None if rows is None else [rows[i] for i in indices]) for key, rows in batch.items()}


class ValueTrainer(_TrainProcess):
    role = "critic"

    def __init__(self, args, num_threads: int = 1) -> None:
        checkpoints = CheckpointConfig.from_args(args, self.role)
        super().__init__(args, self._load_model(ModelSpec.from_args(args), self.role, checkpoints.model_folder(),
                                                num_threads), checkpoints)
        self.loss_config = LossConfig.from_args(args)
        self.advantages = AdvantageConfig.from_args(args)

    def init(self) -> None:
        self._load_trainer_state()

    def compute_values(self, rollout: RolloutBatch) -> Tensors:
        """V_t of every response token under the current critic, before this rollout's steps (the "old" values)."""
        with self.model.eval_mode():
            return no_grad_passes(self.steps.max_tokens_per_no_grad_pass, rollout.samples, self.model.response_values)

    def train(self, rollout_id: int, rollout: RolloutBatch, old_values: Tensors, actor_guard=None) -> dict[str, float]:
        """One rollout's critic steps. ``actor_guard`` is the actor's ``prepare`` result, passed only so that Ray
        starts this after the runtime guard passed: a guard failure then leaves the critic untouched too."""
        samples = rollout.samples
        loss_masks = _as_tensors(sample.loss_mask for sample in samples)
        returns = critic_returns(self.advantages, [sample.reward for sample in samples], loss_masks, old_values)
        batch = {"loss_masks": loss_masks, "returns": returns, "old_values": old_values}

        def micro_batch_loss(indices: list[int], divisor: float):
            values = self.model.response_values([samples[i] for i in indices])
            return value_loss(self.loss_config, _select(batch, indices), values, divisor)

        metrics = self._optimizer_steps(rollout_id, loss_masks, micro_batch_loss, [len(s.tokens) for s in samples])
        return {f"critic/{name}": value for name, value in metrics.items()}
