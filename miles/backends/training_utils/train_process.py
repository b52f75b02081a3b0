"""The train processes: the actor (policy) and, for PPO, the critic. Plain classes; ``miles.ray`` makes them remote.

One implementation for every training backend: the backend only supplies the model (``TrainModel``, see
``train_model.py``), chosen by ``--train-backend``.

Per rollout the actor computes the ratio denominator ("old") once, before its first optimizer step, by the mode the
chosen corrections decide (docs/design.md §3), then takes ``--num-steps-per-rollout`` optimizer steps over
micro-batches whose losses are already scaled by the whole step's divisor, so the gradient does not depend on
micro-batching.
"""

from __future__ import annotations

import contextlib
import math
import random
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from miles.backends import load_train_model
from miles.backends.training_utils import checkpoint
from miles.backends.training_utils.advantages import compute_advantages_and_returns
from miles.backends.training_utils.loss import (
    LossConfig,
    policy_loss,
    step_divisor,
    value_loss,
)
from miles.backends.training_utils.loss_hub.corrections import tis_choice
from miles.backends.training_utils.micro_batches import (
    balanced_order,
    fixed_micro_batches,
    token_budget_micro_batches,
)
from miles.config.lr_schedule import learning_rate, schedule_for_role
from miles.backends.training_utils.optimizer import OptimizerConfig, build_optimizer, set_learning_rate
from miles.backends.training_utils.recompute import Recompute
from miles.backends.training_utils.snapshots import WeightSnapshotStore
from miles.backends.training_utils.train_model import TrainModel
from miles.config import corrections
from miles.guard import mismatch, off_policy
from miles.guard.divergence import check_finite_step, check_finite_weights
from miles.guard.fingerprint import combine_digests, differing_tensors, digest_table, weights_are_finite
from miles.backends.training_utils.parallel import process_parallel_state, set_parallel_state
from miles.ranks.data_parallel import SingleRank, data_parallel_rank
from miles.utils.errors import REPORT_BUG, DivergenceError, MilesConfigError
from miles.utils.types import RolloutBatch, Sample

Tensors = list[torch.Tensor]
SINGLE_RANK = SingleRank()


def _as_tensors(rows, dtype=torch.float32) -> Tensors:
    """One 1-D tensor per row, split from one tensor: one conversion per rollout, not one per sample."""
    rows = list(rows)
    return list(torch.tensor([value for row in rows for value in row], dtype=dtype).split([len(r) for r in rows]))


def run_optimizer_steps(
    clip_grad_norm: Callable[[float], float],
    optimizer: torch.optim.Optimizer,
    loss_masks: Tensors,
    global_batch_size: int,
    micro_batch_size: int,
    per_token: bool,
    clip_grad: float,
    micro_batch_loss: Callable[[list[int], float], tuple[torch.Tensor, dict[str, float]]],
    where: str = "training",
    data_parallel: SingleRank = SINGLE_RANK,
    learning_rate: Callable[[int], float] | None = None,
    lengths: list[int] | None = None,
    max_tokens_per_micro_batch: int | None = None,
    balance_data: bool = False,
) -> dict[str, float]:
    """Optimizer steps over consecutive global batches of sample indices, accumulating micro-batch gradients.

    ``micro_batch_loss(indices, divisor)`` returns a loss already divided by the step's divisor;
    ``clip_grad_norm(max_norm)`` clips the accumulated gradients and returns their norm. Metrics are averaged over
    samples (each micro-batch's metrics weighted by its size); ``grad_norm`` over steps. ``data_parallel`` gives
    this rank its slice of each step and sums gradients and metric totals over the ranks
    (``miles.ranks.data_parallel``), so every rank takes the single-process step and reports its metrics. A
    non-finite loss or gradient norm raises ``DivergenceError`` (naming ``where``) before its step is applied.
    ``learning_rate(s)``, when given, is the rate of this call's step ``s`` (from 0); metric ``lr`` is the rate of
    the last step.

    ``lengths`` (tokens per sample) drive two regroupings of a step's samples that leave its gradient as it is
    (``micro_batches``): ``max_tokens_per_micro_batch`` cuts this rank's share by padded token budget instead of
    ``micro_batch_size``; ``balance_data`` gives the DP ranks shares of similar token totals.
    """
    num_samples = len(loss_masks)
    totals: dict[str, float] = {}
    grad_norms = []
    for step_start in range(0, num_samples, global_batch_size):
        step = list(range(step_start, min(step_start + global_batch_size, num_samples)))
        if learning_rate is not None:
            set_learning_rate(optimizer, learning_rate(len(grad_norms)))
        divisor = step_divisor([loss_masks[i] for i in step], per_token)
        optimizer.zero_grad(set_to_none=True)
        step_loss = 0.0
        if balance_data:
            step = balanced_order(step, lengths, data_parallel.size)
        local = data_parallel.local_indices(step)
        if max_tokens_per_micro_batch is None:
            micro_batches = fixed_micro_batches(local, micro_batch_size)
        else:
            micro_batches = token_budget_micro_batches(local, lengths, max_tokens_per_micro_batch)
        for micro in micro_batches:
            loss, metrics = micro_batch_loss(micro, divisor)
            loss.backward()
            step_loss += float(loss.detach())
            for name, value in metrics.items():
                totals[name] = totals.get(name, 0.0) + value * len(micro)
        data_parallel.reduce_gradients(p for group in optimizer.param_groups for p in group["params"])
        grad_norms.append(clip_grad_norm(clip_grad))
        check_finite_step(where, len(grad_norms) - 1, step_loss, grad_norms[-1])
        optimizer.step()
    totals = data_parallel.sum_totals(totals)
    averaged = {name: total / num_samples for name, total in totals.items()}
    averaged["grad_norm"] = sum(grad_norms) / len(grad_norms)
    averaged["lr"] = optimizer.param_groups[0]["lr"]
    return averaged


class _TrainProcess:
    """What the actor and the critic share: threads, seeding, optimizer steps and schedule, checkpoints."""

    role = ""

    def __init__(self, args, model: TrainModel) -> None:
        self.args = args
        self.model = model
        self.model.module.train()
        self.schedule = schedule_for_role(args, self.role)
        self.optimizer = build_optimizer(self.model.module.named_parameters(), OptimizerConfig.from_args(args),
                                         self.schedule.max_lr)
        self.optimizer_steps = 0  # iterations so far, over the whole run (lr_schedule's module docstring)
        self.trained_rollout: int | None = None  # the rollout whose training the live weights hold; None part-way
        # set once the model (and its process groups) exist; the loss's hooks and cp_utils read it too
        state = process_parallel_state(args.tensor_model_parallel_size)
        set_parallel_state(state)
        self.data_parallel = data_parallel_rank(state)

    def _no_grad_passes(self, samples: list[Sample], forward: Callable[[list[Sample]], Tensors]) -> Tensors:
        """``forward`` over all samples at once, or with --use-dynamic-batch-size over micro-batches within
        --log-probs-max-tokens-per-gpu: each row is masked from the others, so per-sample outputs agree to float rounding."""
        if not self.args.use_dynamic_batch_size:
            return forward(samples)
        lengths = [len(sample.tokens) for sample in samples]
        outputs: list[torch.Tensor | None] = [None] * len(samples)
        for micro in token_budget_micro_batches(range(len(samples)), lengths, self.args.log_probs_max_tokens_per_gpu):
            for i, output in zip(micro, forward([samples[i] for i in micro]), strict=True):
                outputs[i] = output
        return outputs

    def trained_rollout_id(self) -> int | None:
        """The rollout whose training the live weights hold (None: part-way through one), for a save on a stop."""
        return self.trained_rollout

    def _optimizer_steps(self, rollout_id: int, loss_masks: Tensors, micro_batch_loss,
                         lengths: list[int] | None = None) -> dict[str, float]:
        # lengths: tokens per sample, read by --use-dynamic-batch-size and --balance-data
        """``run_optimizer_steps`` on this process's model and flags, keeping ``trained_rollout`` true."""
        previous, self.trained_rollout = self.trained_rollout, None
        try:
            metrics = run_optimizer_steps(
                self.model.clip_grad_norm, self.optimizer, loss_masks, self.args.global_batch_size,
                self.args.micro_batch_size, self.args.calculate_per_token_loss, self.args.clip_grad, micro_batch_loss,
                where=f"rollout {rollout_id}, {self.role}", data_parallel=self.data_parallel,
                learning_rate=lambda step: learning_rate(self.optimizer_steps + step, self.schedule),
                lengths=lengths,
                max_tokens_per_micro_batch=self.args.max_tokens_per_gpu if self.args.use_dynamic_batch_size else None,
                balance_data=self.args.balance_data,
            )
        except DivergenceError as error:
            if not error.weights_changed:
                self.trained_rollout = previous
            raise
        self.trained_rollout = rollout_id
        self.optimizer_steps += math.ceil(len(loss_masks) / self.args.global_batch_size)
        return metrics

    def save(self, root: str, rollout_id: int, extra_state: dict | None = None,
             version_weights: dict[int, dict] | None = None) -> str | None:
        """One checkpoint per role: data-parallel replicas are identical, so only DP rank 0's tensor-parallel ranks
        take part (they gather the weights and their optimizer states), and its TP rank 0 writes.
        ``version_weights``: HF weights of pushed versions to keep beside the role's own (the actor's)."""
        if not self.data_parallel.writes_checkpoint:
            return None
        optimizers = self.model.gather_over_tensor_parallel(self.optimizer.state_dict())  # each is its shards'
        # Sharded weights are gathered here, where every tensor-parallel rank takes part; whole ones are saved as is.
        hf_state = self.model.hf_state_dict() if len(optimizers) > 1 else None
        if self.model.tensor_parallel_rank != 0:
            return None
        state = {
            "rollout_id": rollout_id,
            "train_backend": self.args.train_backend,  # the optimizer state is laid out for its parameters
            "optimizer": optimizers[0],
            "optimizer_name": self.args.optimizer,
            "optimizer_steps": self.optimizer_steps,  # the schedule's position: a resume continues it exactly
            "tensor_model_parallel_size": len(optimizers),
            **({"tensor_parallel_optimizers": optimizers} if len(optimizers) > 1 else {}),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            **(extra_state or {}),
        }
        return str(checkpoint.save_role(root, rollout_id, self.role, self.model, state, self.args.hf_checkpoint,
                                        hf_state, version_weights))

    def _load_trainer_state(self, root: str) -> dict | None:
        rollout_id = checkpoint.latest_rollout_id(root)
        if rollout_id is None:
            return None
        role_dir = checkpoint.rollout_dir(root, rollout_id) / self.role
        state = checkpoint.load_trainer_state(role_dir)
        checkpoint.check_same_train_backend(state, role_dir, self.args.train_backend)
        checkpoint.check_same_tensor_parallel_size(state, role_dir, self.args.tensor_model_parallel_size)
        optimizers = state.get("tensor_parallel_optimizers", [state["optimizer"]])
        checkpoint.check_same_optimizer(state, role_dir, self.args.optimizer, len(self.optimizer.param_groups))
        self.optimizer.load_state_dict(optimizers[self.model.tensor_parallel_rank])
        self.optimizer_steps = state["optimizer_steps"]
        _restore_rng(state)
        return state

    def model_and_optimizer_state(self) -> dict:
        """Copies of the weights and the optimizer state (to inspect a loaded or trained process)."""
        return {"model": self.model.native_state_dict(), "optimizer": self.optimizer.state_dict()}


def _restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])


def _load_role_model(args, role: str, hf_folder: str, seed: int, num_threads: int) -> TrainModel:
    """The role's model on ``--train-backend``, after pinning this process's torch threads (loading runs torch ops)."""
    torch.set_num_threads(num_threads)
    dropout = {"attention_dropout": args.attention_dropout, "hidden_dropout": args.hidden_dropout}
    return load_train_model(args.train_backend, role, hf_folder, seed, args.tensor_model_parallel_size, dropout,
                            Recompute.from_args(args), args.sequence_parallel)


def _load_dir(root: str | None, role: str, fallback: str) -> str:
    rollout_id = checkpoint.latest_rollout_id(root) if root else None
    return fallback if rollout_id is None else str(checkpoint.rollout_dir(root, rollout_id) / role)


@dataclass
class _PreparedRollout:
    """What ``PolicyTrainer.prepare`` computed once for a rollout, before its first optimizer step."""

    rollout_id: int
    samples: list[Sample]
    batch: dict


class PolicyTrainer(_TrainProcess):
    role = "actor"

    def __init__(self, args, num_threads: int = 1) -> None:
        folder = _load_dir(args.load, "actor", args.hf_checkpoint)
        super().__init__(args, _load_role_model(args, "actor", folder, args.seed, num_threads))
        self.loss_config = LossConfig.from_args(args)
        self.ref_model = self._load_ref_model(args)
        self.chosen = corrections.chosen_labels(args)  # the corrections table's rows this run chose
        # a snapshot per pushed version, when a chosen row recomputes the denominator with the behavior's weights
        self.snapshots = WeightSnapshotStore() if corrections.keeps_snapshots(self.chosen) else None
        self.weight_version = 0  # pushes so far; version v is the v-th push (docs/design.md §2)
        self.version_to_rollouts_trained: dict[int, int] = {}
        self.pushed_fingerprints: dict[int, str] = {}
        self.correction = corrections.label_in_effect(self.chosen)
        # the built-in TIS whose drop fractions the report shows (none when a hook replaces it)
        self.tis_choice = None if args.custom_tis_function_path else tis_choice(args)
        self._prepared: _PreparedRollout | None = None
        self._guard_s = 0.0
        self._push_guard_s = 0.0  # the last export's finiteness check and fingerprint, reported with the next rollout
        self._resume_push: tuple[int, dict | None] | None = None  # an exact resume's first push (_restore_pushes)
        # The engines' weights, once the actor trained past them (--update-weights-interval > 1), for a save; with
        # --keep-old-actor the snapshot store holds them already.
        self._keeps_engine_weights = bool(args.save) and args.update_weights_interval > 1 and self.snapshots is None
        self._engine_weights: tuple[int, dict] | None = None

    @staticmethod
    def _load_ref_model(args):
        if not (args.use_kl_loss or args.kl_coef != 0):
            return None
        ref = load_train_model(args.train_backend, "actor", args.ref_load or args.hf_checkpoint, args.seed,
                               args.tensor_model_parallel_size, sequence_parallel=args.sequence_parallel)
        ref.module.eval().requires_grad_(False)
        return ref

    def init(self, exact_resume: bool = False) -> int:
        """Load ``--load`` if it has a checkpoint; return the first rollout id to train. ``exact_resume``: the run
        continues the straight run (``checkpoint.resume_run_state``), so the guard's version tables, the snapshots
        and the engines' weights are restored as well, and the start-up push re-pushes the engines' version."""
        state = self._load_trainer_state(self.args.load) if self.args.load else None
        if state is None:
            return self.args.start_rollout_id or 0
        self.weight_version = state["weight_version"]
        self.trained_rollout = state["rollout_id"]
        if exact_resume:
            self._restore_pushes(state)
        return self.args.start_rollout_id if self.args.start_rollout_id is not None else state["rollout_id"] + 1

    def _restore_pushes(self, state: dict) -> None:
        """The straight run's pushes as the save left them: the version -> rollouts-trained and fingerprint tables,
        the --keep-old-actor snapshots, and the version the engines held, to be pushed again under its own number
        (``export_weights``). Saved weights load only if they hash to the fingerprint recorded at their push."""
        self.version_to_rollouts_trained = dict(state["version_to_rollouts_trained"])
        self.pushed_fingerprints = dict(state["pushed_fingerprints"])
        role_dir = checkpoint.rollout_dir(self.args.load, state["rollout_id"]) / self.role
        saved = {version: self._load_version(role_dir, version) for version in state["saved_versions"]}
        engine_version = state["weight_version"]
        if self.snapshots is not None:  # the snapshots older than the engines' (they are saved with it, and only then)
            for version in sorted(v for v in saved if v != engine_version):
                self.snapshots.add_pushed(version, *saved[version])
        self.weight_version = engine_version - 1
        self._resume_push = (engine_version, saved[engine_version][0] if engine_version in saved else None)
        _restore_rng(state)  # loading a model seeds torch

    def _load_version(self, role_dir, version: int) -> tuple[dict, dict, dict | None]:
        """(native weights, HF digests, native digests) of a saved pushed version, checked against its fingerprint."""
        folder = checkpoint.version_dir(role_dir, version)
        model = load_train_model(self.args.train_backend, "actor", str(folder), self.args.seed,
                                 self.args.tensor_model_parallel_size)
        digests = digest_table(model.hf_state_dict())
        if combine_digests(digests) != self.pushed_fingerprints[version]:
            raise MilesConfigError(
                f"--load: {folder} holds weights with fingerprint {combine_digests(digests)[:12]}, but weight version "
                f"{version} was pushed with {self.pushed_fingerprints[version][:12]}: the checkpoint was changed after "
                f"it was saved. Load an intact checkpoint, or start a new run from its weights: --hf-checkpoint "
                f"{role_dir} without --load."
            )
        native = model.module.state_dict()
        return native, digests, digests if model.native_layout_is_hf else None

    def save(self, root: str, rollout_id: int, extra_state: dict | None = None) -> str:
        """The checkpoint also holds the guard's tables and the weights of the pushed versions still live (the
        engines', the --keep-old-actor snapshots) that are not the actor's own, so a resume continues exactly."""
        live = {self.weight_version, *(self.snapshots.versions() if self.snapshots is not None else ())}
        weights = {version: self._pushed_weights(version) for version in sorted(live)
                   if version > 0 and self.version_to_rollouts_trained.get(version) != rollout_id + 1}
        pushes = {"weight_version": self.weight_version, "saved_versions": sorted(weights),
                  "version_to_rollouts_trained": self.version_to_rollouts_trained,
                  "pushed_fingerprints": self.pushed_fingerprints}
        return super().save(root, rollout_id, {**pushes, **(extra_state or {})}, weights)

    def _pushed_weights(self, version: int) -> dict:
        """HF weights of a pushed version that the live weights moved past (on every TP rank: it gathers)."""
        if self.snapshots is not None and version in self.snapshots.versions():
            return self.model.hf_state_dict(self.snapshots.get(version).state_dict)
        if self._engine_weights is not None and self._engine_weights[0] == version:
            return self._engine_weights[1]
        raise RuntimeError(f"the weights of pushed version {version} are no longer held. {REPORT_BUG}")

    def export_weights(self, rollouts_trained: int, after_training: bool = False) -> dict:
        """Weights for the engines as the next version, with their fingerprint; with --keep-old-actor, a snapshot.

        ``after_training``: this push follows the training of rollout ``rollouts_trained - 1``. The driver submits
        it together with that ``train`` (Ray runs them in order), so it checks here that the training succeeded:
        weights that do not hold it are never pushed (that failure is the run's error; this one only follows it).
        The start-up push of an exact resume pushes the engines' saved version again instead (``_restore_pushes``).
        """
        if self._resume_push is not None:
            return self._push_again(*self._resume_push)
        if after_training and self.trained_rollout != rollouts_trained - 1:
            raise RuntimeError(f"weight version {self.weight_version + 1} is not pushed: the weights do not hold the "
                               f"training of rollout {rollouts_trained - 1}, which failed (that error is the cause)")
        return self._export(rollouts_trained)

    def _push_again(self, version: int, native_state: dict | None) -> dict:
        """Push saved ``version`` (``native_state``, or the live weights) under its own number and fingerprint."""
        self._resume_push, fingerprint = None, self.pushed_fingerprints[version]
        with self.model.swapped_weights(native_state) if native_state is not None else contextlib.nullcontext():
            pushed = self._export(self.version_to_rollouts_trained[version])
        if pushed["fingerprint"] != fingerprint:
            raise MilesConfigError(
                f"--load: the actor's weights hash to fingerprint {pushed['fingerprint'][:12]}, but weight version "
                f"{version} was pushed with {fingerprint[:12]}: the checkpoint was changed after it was saved. Load an "
                f"intact checkpoint, or start a new run from its weights (--hf-checkpoint) without --load.")
        return pushed

    def _export(self, rollouts_trained: int) -> dict:
        self.weight_version += 1
        state_dict = self.model.hf_state_dict()  # exactly what the engines load and fingerprint
        start = time.perf_counter()
        finite = weights_are_finite(state_dict)
        if not finite:
            self.trained_rollout = None  # non-finite weights are no rollout's to save
        check_finite_weights(f"weight version {self.weight_version} (after {rollouts_trained} rollouts)", finite)
        digests = digest_table(state_dict)
        fingerprint = combine_digests(digests)
        self._push_guard_s = time.perf_counter() - start
        self.version_to_rollouts_trained[self.weight_version] = rollouts_trained
        self.pushed_fingerprints[self.weight_version] = fingerprint
        if self.snapshots is not None:
            native_state = self.model.module.state_dict()
            start = time.perf_counter()  # the guard's part: the hash of the snapshot's layout, where it is not HF's
            native_digests = digests if self.model.native_layout_is_hf else digest_table(native_state)
            self._push_guard_s += time.perf_counter() - start
            self.snapshots.add_pushed(self.weight_version, native_state, digests, native_digests)
        elif self._keeps_engine_weights:
            self._engine_weights = (self.weight_version, state_dict)
        return {"version": self.weight_version, "fingerprint": fingerprint, "state_dict": state_dict}

    @contextlib.contextmanager
    def _guard_time(self):
        start = time.perf_counter()
        try:
            yield
        finally:
            self._guard_s += time.perf_counter() - start

    def _forward_log_probs(self, model: TrainModel, samples: list[Sample]) -> Tensors:
        with model.eval_mode():
            return self._no_grad_passes(
                samples, lambda part: model.response_log_probs(part, self.args.rollout_temperature)[0])

    def _check_provenance(self, rollout_id: int, samples: list[Sample], expected_staleness: int) -> list[int]:
        """The guard's checks that need no forward pass: versions, staleness, pushed fingerprints, engine log-probs."""
        versions = off_policy.check_one_version_per_sample(rollout_id, [s.weight_versions for s in samples])
        staleness = off_policy.sample_staleness(rollout_id, versions, self.version_to_rollouts_trained)
        off_policy.check_staleness(rollout_id, staleness, expected_staleness, self.args.max_weight_staleness)
        off_policy.check_engine_loaded_pushed_weights(
            rollout_id, versions, [s.weight_fingerprint for s in samples], self.pushed_fingerprints
        )
        if corrections.needs_rollout_log_probs(self.chosen):
            off_policy.check_rollout_log_probs(
                rollout_id, [s.rollout_log_probs for s in samples], [s.response_length for s in samples]
            )
        return staleness

    def _check_contract(self, rollout_id: int, staleness: int) -> None:
        """The async contract on this batch: a stale PPO rollout needs a correction that satisfies it."""
        off_policy.check_correction_per_batch(rollout_id, staleness, self.args.use_critic, self.chosen)

    def _snapshot_log_probs(self, rollout_id: int, samples: list[Sample]) -> Tensors:
        """The snapshot row: the denominator from the snapshot of the version that generated the rollout."""
        version = samples[0].weight_versions[0]
        with self._guard_time():
            snapshot = self.snapshots.take_for_training(version, rollout_id)
            # The snapshot's tensors are hashed again, in the trainer's layout, against their digests when it was
            # taken, so a wrong tensor under the right label fails. Intact, it holds what was pushed: its
            # fingerprint is the push's. Otherwise it is converted to the layout the engines received, so the
            # fingerprint and the error name tensors as the engines know them (against the push's digests).
            differing = ()
            if self.model.on_every_rank(digest_table(snapshot.state_dict) == snapshot.native_digests):  # TP: all agree
                snapshot_fingerprint = self.pushed_fingerprints[snapshot.version]  # combine_digests(snapshot.digests)
            else:
                digests = digest_table(self.model.hf_tensors(snapshot.state_dict))
                snapshot_fingerprint, differing = combine_digests(digests), differing_tensors(snapshot.digests, digests)
            for sample_version, sample_fingerprint in {(s.weight_versions[0], s.weight_fingerprint) for s in samples}:
                off_policy.check_snapshot_provenance(
                    rollout_id, sample_version, sample_fingerprint, snapshot.version, snapshot_fingerprint, differing)
            referenced = [version] + [v for v in self.pushed_fingerprints if v > version]
            off_policy.check_snapshot_count(rollout_id, self.snapshots.versions(), referenced, limit=2)
        with self.model.swapped_weights(snapshot.state_dict):
            return self._forward_log_probs(self.model, samples)

    def _recomputed_old_log_probs(self, rollout_id: int, samples: list[Sample]) -> Tensors | None:
        """The recompute pass: snapshot weights (the snapshot row), the current actor, or skipped."""
        if self.snapshots is not None:
            return self._snapshot_log_probs(rollout_id, samples)
        if corrections.denominator(self.chosen) == corrections.ROLLOUT and not self.args.get_mismatch_metrics:
            return None  # the engine's log-probs are the denominator: no recompute pass
        return self._forward_log_probs(self.model, samples)

    def _advantages(self, samples: list[Sample], loss_masks, values, old_log_probs, rollout_log_probs, ref_log_probs):
        kl = None
        if self.args.kl_coef != 0:
            base = old_log_probs if old_log_probs is not None else rollout_log_probs
            kl = [b - r for b, r in zip(base, ref_log_probs, strict=True)]
        advantages, _ = compute_advantages_and_returns(
            self.args.advantage_estimator, [sample.reward for sample in samples], loss_masks, values,
            group_size=self.args.n_samples_per_prompt, gamma=self.args.gamma, lambd=self.args.lambd,
            std_normalization=self.args.grpo_std_normalization,
            normalize=self.args.normalize_advantages, kl=kl, kl_coef=self.args.kl_coef,
        )
        return advantages

    def prepare(self, rollout_id: int, rollout: RolloutBatch, expected_staleness: int, values: Tensors | None = None):
        """Guard the rollout and compute, once and before any optimizer step, its denominator and advantages.

        Raises ``OffPolicyGuardError`` before any weight changes; returns the rollout's off-policy report.
        """
        start, self._guard_s = time.perf_counter(), 0.0
        samples = rollout.samples
        with self._guard_time():
            staleness = self._check_provenance(rollout_id, samples, expected_staleness)
            self._check_contract(rollout_id, max(staleness))
        loss_masks = _as_tensors(sample.loss_mask for sample in samples)
        rollout_log_probs = _as_tensors(sample.rollout_log_probs for sample in samples)
        old_log_probs = self._recomputed_old_log_probs(rollout_id, samples)
        report = {"staleness_mean": sum(staleness) / len(staleness), "staleness_max": float(max(staleness)),
                  "behavior_version": float(samples[0].weight_versions[0]), "correction": self.correction}
        if old_log_probs is not None:
            with self._guard_time():  # the comparison check_denominator_tolerance reads
                report.update(off_policy.denominator_abs_diff(old_log_probs, rollout_log_probs))
            # metrics, not checks: the importance weights and the richer mismatch report
            report.update(off_policy.behavior_weight_report(
                old_log_probs, rollout_log_probs, self.args.tis_clip, self.args.tis_clip_low))
            report.update(mismatch.mismatch_report(old_log_probs, rollout_log_probs, loss_masks, self.tis_choice))
        if self.snapshots is not None:
            with self._guard_time():
                off_policy.check_denominator_tolerance(
                    rollout_id, report["denominator_behavior_abs_diff_max"], self.args.keep_old_actor_tol)
            report["num_snapshots"] = float(len(self.snapshots))
        ref_log_probs = self._forward_log_probs(self.ref_model, samples) if self.ref_model is not None else None
        batch = {"loss_masks": loss_masks, "old_log_probs": old_log_probs, "rollout_log_probs": rollout_log_probs,
                 "ref_log_probs": ref_log_probs, "total_lengths": [len(sample.tokens) for sample in samples],
                 "advantages": self._advantages(samples, loss_masks, values, old_log_probs, rollout_log_probs,
                                                ref_log_probs)}
        metrics = {f"off_policy/{name}": value for name, value in report.items()}
        metrics["perf/guard_s"] = self._guard_s + self._push_guard_s  # the checks of this rollout and of its push
        self._push_guard_s = 0.0
        metrics["perf/prepare_s"] = time.perf_counter() - start
        self._prepared = _PreparedRollout(rollout_id, samples, batch)
        if rollout_id < self.args.num_critic_only_steps:
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
        first_step = set(range(min(self.args.global_batch_size, len(samples))))
        first_step_log_probs: dict[int, torch.Tensor] = {}

        def micro_batch_loss(indices: list[int], divisor: float):
            log_probs, entropy = self.model.response_log_probs(
                [samples[i] for i in indices], self.args.rollout_temperature, with_entropy=True
            )
            for i, lp in zip(indices, log_probs, strict=True):
                if i in first_step and i not in first_step_log_probs:
                    first_step_log_probs[i] = lp.detach()
            return policy_loss(self.loss_config, _select(batch, indices), log_probs, entropy, divisor)

        metrics = self._optimizer_steps(rollout_id, batch["loss_masks"], micro_batch_loss, batch["total_lengths"])
        metrics = {f"train/{name}": value for name, value in metrics.items()}
        first_step_log_probs = self.data_parallel.merged(first_step_log_probs)  # each rank saw its slice
        first = sorted(first_step_log_probs)
        drift = off_policy.policy_vs_behavior(
            [first_step_log_probs[i] for i in first], [batch["rollout_log_probs"][i] for i in first]
        )
        metrics.update({f"off_policy/{name}": value for name, value in drift.items()})
        metrics["perf/train_s"] = time.perf_counter() - start
        metrics["perf/actor_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return metrics


def _select(batch: dict, indices: list[int]) -> dict:
    return {key: (None if rows is None else [rows[i] for i in indices]) for key, rows in batch.items()}


class ValueTrainer(_TrainProcess):
    role = "critic"

    def __init__(self, args, num_threads: int = 1) -> None:
        folder = _load_dir(args.critic_load, "critic", args.hf_checkpoint)
        super().__init__(args, _load_role_model(args, "critic", folder, args.seed + 1, num_threads))
        self.loss_config = LossConfig.from_args(args)

    def init(self) -> None:
        state = self._load_trainer_state(self.args.critic_load) if self.args.critic_load else None
        if state is not None:
            self.trained_rollout = state["rollout_id"]

    def compute_values(self, rollout: RolloutBatch) -> Tensors:
        """V_t of every response token under the current critic, before this rollout's steps (the "old" values)."""
        with self.model.eval_mode():
            return self._no_grad_passes(rollout.samples, self.model.response_values)

    def train(self, rollout_id: int, rollout: RolloutBatch, old_values: Tensors, actor_guard=None) -> dict[str, float]:
        """One rollout's critic steps. ``actor_guard`` is the actor's ``prepare`` result, passed only so that Ray
        starts this after the runtime guard passed: a guard failure then leaves the critic untouched too."""
        samples = rollout.samples
        loss_masks = _as_tensors(sample.loss_mask for sample in samples)
        _, returns = compute_advantages_and_returns(
            "ppo", [sample.reward for sample in samples], loss_masks, old_values,
            group_size=self.args.n_samples_per_prompt, gamma=self.args.gamma, lambd=self.args.lambd,
            std_normalization=True, normalize=False,
        )
        batch = {"loss_masks": loss_masks, "returns": returns, "old_values": old_values}

        def micro_batch_loss(indices: list[int], divisor: float):
            values = self.model.response_values([samples[i] for i in indices])
            return value_loss(self.loss_config, _select(batch, indices), values, divisor)

        metrics = self._optimizer_steps(rollout_id, loss_masks, micro_batch_loss, [len(s.tokens) for s in samples])
        return {f"critic/{name}": value for name, value in metrics.items()}
