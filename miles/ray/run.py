"""Everything the drivers orchestrate, behind a few verbs: generate, train, update_weights, finish_rollout.

``training_run(args, driver)`` resolves the embedded default, checks the inputs, starts (or joins) Ray, places the
engines, the actor and the critic, loads ``--load``, pushes the first weight version (1, or the next one after a
resume), and on exit releases every actor, closes the metrics and prints the summary. The verbs return Ray
object references, so the async driver can overlap them.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass

import ray
import torch

from miles.backends.megatron_backend.support import check_megatron_backend
from miles.backends.training_utils import checkpoint
from miles.backends.training_utils.train_process import PolicyTrainer, ValueTrainer
from miles.ranks.layout import train_layouts
from miles.ranks.role import TrainRole, rank_died_error
from miles.ray.cluster import count_bundles, create_placement, ray_session
from miles.ray.rollout_manager import create_rollout_manager
from miles.rollout.embedded import ensure_embedded_default
from miles.utils import off_policy
from miles.utils.errors import OffPolicyGuardError
from miles.utils.plot import plot_run
from miles.utils.preflight import check_rollouts_left, preflight
from miles.utils.tracking import MetricsTracker, default_log_dir, format_summary

logger = logging.getLogger("miles")


def resolve_run_paths(args, driver: str) -> None:
    """Fill the embedded default's model and data, and the run folder, where the flags left them unset."""
    if args.hf_checkpoint is None or args.prompt_data is None:
        embedded = ensure_embedded_default()
        if args.hf_checkpoint is None:
            args.hf_checkpoint = embedded.checkpoint_dir
            logger.info("derived hf_checkpoint = %s (the embedded default)", args.hf_checkpoint)
        if args.prompt_data is None:
            args.prompt_data = embedded.train_jsonl
            if args.eval_prompt_data is None:
                args.eval_prompt_data = embedded.eval_jsonl
            logger.info("derived prompt_data = %s, eval_prompt_data = %s", args.prompt_data, args.eval_prompt_data)
    if args.log_dir is None:
        args.log_dir = default_log_dir(driver, args.advantage_estimator)
        logger.info("derived log_dir = %s", args.log_dir)


@dataclass
class TrainingRun:
    args: object
    rollout_manager: object
    actor: object
    critic: object | None
    tracker: MetricsTracker
    start_rollout_id: int
    last_finished_rollout: int | None = None
    last_saved_rollout: int | None = None

    def save_on_guard_error(self, error: OffPolicyGuardError) -> None:
        """A guard violation stops the run; the last rollout that trained cleanly is saved first (with --save)."""
        logger.error("runtime guard: %s", getattr(error, "cause", None) or error)
        if self.args.save and self.last_finished_rollout is not None:
            self.save(self.last_finished_rollout)

    @staticmethod
    def wait(refs):
        """Block until the referenced results are ready and return them (the sync driver's ``await``)."""
        return ray.get(refs)

    @staticmethod
    async def settled(ref) -> None:
        """Await an earlier call that nothing else waits for (a push), so its failure surfaces here."""
        if ref is not None:
            await ref

    def rollout_ids(self) -> range:
        return range(self.start_rollout_id, self.args.num_rollout)

    def generate(self, rollout_id: int):
        """(rollout data ref, rollout metrics ref)."""
        return self.rollout_manager.generate.options(num_returns=2).remote(rollout_id)

    def train(self, rollout_id: int, rollout_ref, expected_staleness: int) -> list:
        """Refs of the rollout's metrics. The actor first guards the rollout and computes its denominator; PPO's
        critic values (taken before its step) feed both the actor and the critic, which steps after the guard."""
        values_ref = self.critic.compute_values.remote(rollout_ref) if self.critic is not None else None
        guard_ref = self.actor.prepare.remote(rollout_id, rollout_ref, expected_staleness, values_ref)
        if self.critic is None:
            return [self.actor.train.remote(rollout_id, guard_ref)]
        refs = [self.critic.train.remote(rollout_id, rollout_ref, values_ref, guard_ref)]
        critic_only = rollout_id < self.args.num_critic_only_steps
        return refs + [guard_ref if critic_only else self.actor.train.remote(rollout_id, guard_ref)]

    def update_weights(self, rollouts_trained: int):
        """Push the actor's weights to the engines as the next version, through the object store."""
        return self.rollout_manager.load_weights.remote(self.actor.export_weights.remote(rollouts_trained))

    def finish_rollout(self, rollout_id: int, metrics: list[dict]) -> None:
        """Save and evaluate when due, log the rollout's metrics, and stop if the policy drifted past --max-behavior-kl."""
        merged = {name: value for part in metrics for name, value in part.items()}
        if self._due(self.args.eval_interval, rollout_id):
            merged.update(ray.get(self.rollout_manager.evaluate.remote(rollout_id)))
        if self.args.save and (self._due(self.args.save_interval, rollout_id) or self._is_last(rollout_id)):
            self.save(rollout_id)
        self.tracker.log(rollout_id, merged)
        self.last_finished_rollout = rollout_id
        if "off_policy/policy_behavior_kl" in merged:
            off_policy.check_behavior_kl(rollout_id, merged["off_policy/policy_behavior_kl"],
                                         self.args.max_behavior_kl, merged.get("off_policy/correction", "none"))

    def save(self, rollout_id: int) -> None:
        if rollout_id == self.last_saved_rollout:
            return
        roles = [(self.actor, self.args.save)]
        if self.critic is not None:
            roles.append((self.critic, self.args.critic_save))
        ray.get([process.save.remote(root, rollout_id) for process, root in roles])
        for root in {root for _, root in roles}:  # only once every role of this rollout is on disk
            checkpoint.mark_latest(root, rollout_id)
        self.last_saved_rollout = rollout_id
        logger.info("saved rollout %d to %s", rollout_id, self.args.save)

    def should_stop(self, rollout_id: int) -> bool:
        return self.args.debug_exit_after_rollout is not None and rollout_id >= self.args.debug_exit_after_rollout

    def _due(self, interval: int | None, rollout_id: int) -> bool:
        return bool(interval) and (rollout_id + 1) % interval == 0

    def _is_last(self, rollout_id: int) -> bool:
        return rollout_id == self.args.num_rollout - 1 or self.should_stop(rollout_id)


def _create_train_roles(args, roles: list) -> tuple[TrainRole, TrainRole | None]:
    """The actor's ranks and, for PPO, the critic's, each in its own placement group; started together so the two
    roles load their models at the same time. ``roles`` collects them for release."""
    for layout in train_layouts(args):
        roles.append(TrainRole(PolicyTrainer if layout.role == "actor" else ValueTrainer, args, layout,
                               args.ray_placement_timeout))
    for role in roles:
        role.start()
    return roles[0], (roles[1] if len(roles) > 1 else None)


def _derive_num_rollout(args, num_prompts: int) -> None:
    if args.num_epoch is not None:
        args.num_rollout = math.ceil(args.num_epoch * num_prompts / args.rollout_batch_size)
        logger.info("derived num_rollout = %d (from --num-epoch %d over %d prompts)",
                    args.num_rollout, args.num_epoch, num_prompts)


@contextlib.contextmanager
def training_run(args, driver: str):
    resolve_run_paths(args, driver)
    _derive_num_rollout(args, num_prompts=preflight(args))
    check_rollouts_left(args)
    train_ranks = sum(layout.world_size for layout in train_layouts(args))
    with ray_session(args.ray_address, num_cpus=count_bundles(args.rollout_num_engines, train_ranks, args.colocate)):
        roles, placement = [], None
        try:
            actor, critic = _create_train_roles(args, roles)
            placement = create_placement(args.rollout_num_engines, args.colocate, args.ray_placement_timeout,
                                         actor.group, actor.layout.num_nodes)
            rollout_manager = create_rollout_manager(args, placement)
            start_rollout_id = ray.get(actor.init.remote())
            if critic is not None:
                ray.get(critic.init.remote())
            ray.get(rollout_manager.load_weights.remote(actor.export_weights.remote(start_rollout_id)))
            with MetricsTracker(args.log_dir, args.use_tensorboard, args.num_rollout, start_rollout_id,
                                vars(args), driver) as tracker:
                run = TrainingRun(args, rollout_manager, actor, critic, tracker, start_rollout_id)
                try:
                    yield run
                except OffPolicyGuardError as error:
                    run.save_on_guard_error(error)
                    raise
            print(format_summary(tracker.close()))
            for path in plot_run(args.log_dir):
                print(f"plot: {path}")
        except ray.exceptions.RayError as error:
            if (died := rank_died_error(roles)) is not None:
                raise died from error
            raise
        finally:
            if placement is not None:
                placement.release()
            for role in roles:
                role.release()
