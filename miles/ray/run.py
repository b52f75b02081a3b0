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
import re
import time
from dataclasses import dataclass, field

import ray

from miles.backends.training_utils import checkpoint
from miles.backends.training_utils.lr_schedule import check_lr_schedules
from miles.backends.training_utils.train_process import PolicyTrainer, ValueTrainer
from miles.guard import off_policy
from miles.ranks.layout import train_layouts
from miles.ranks.role import TrainRole, dead_rank_names, start_roles
from miles.ray.cluster import count_bundles, create_placement, ray_session
from miles.ray.rollout_manager import create_rollout_manager
from miles.rollout.embedded import ensure_embedded_default
from miles.tracking.metrics import MetricsTracker, default_log_dir, format_summary
from miles.tracking.plot import plot_run
from miles.tracking.wandb_run import WandbSettings
from miles.utils.errors import MilesRunError, ProcessDiedError, RunInterrupted
from miles.ray.preflight import check_rollouts_left, preflight
from miles.utils.stop_signals import StopRequest

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
    stop_request: StopRequest = field(default_factory=StopRequest)
    last_finished_rollout: int | None = None
    last_saved_rollout: int | None = None
    stop_after_rollout: int | None = None  # decided once per rollout, so its save and the driver's break agree
    last_log_s: float | None = None  # the latest tracker.log's duration, reported with the next rollout
    # Every reference a verb returned that the driver has not yet seen succeed, by rollout (generate, train) or by
    # push. A step's failure makes the steps submitted after it fail too; each such reference must be awaited, or
    # Ray prints an "Unhandled error" dump when it is dropped (``release_unsettled``).
    unsettled: dict[tuple[str, int], list] = field(default_factory=dict)

    def stopped(self, error: MilesRunError) -> MilesRunError:
        """A guard, divergence or drift stop: save the last rollout that finished (with --save) if every train
        process still holds its weights, and return the error (unwrapped from Ray) ending with the checkpoint."""
        cause = error.cause if isinstance(getattr(error, "cause", None), MilesRunError) else error
        if isinstance(cause, RunInterrupted):  # a second signal: stop at once, its message names the checkpoint
            return cause
        last, note = self.last_finished_rollout, ""
        if self.args.save and last is not None:
            if self._roles_hold(last):
                self.save(last)
            else:
                note = f"Rollout {last} is not saved: a train process had already stepped on rollout {last + 1}. "
        saved = self.args.save and last is not None and self.last_saved_rollout == last
        cause.args = (f"{cause} {note}{checkpoint_note(self.args, saved)}",)
        return cause

    def interrupted(self) -> RunInterrupted:
        """The stop the first SIGINT/SIGTERM asked for, after the rollout in progress finished and was saved."""
        after = "before any rollout finished" if self.last_finished_rollout is None else (
            f"after rollout {self.last_finished_rollout}")
        saved_now = self.last_saved_rollout is not None and self.last_saved_rollout == self.last_finished_rollout
        note = checkpoint_note(self.args, saved_now)
        return RunInterrupted(f"{self.stop_request.name} received: stopped {after}. {note}", self.stop_request.signum)

    def _roles_hold(self, rollout_id: int) -> bool:
        roles = [self.actor] + ([self.critic] if self.critic is not None else [])
        return all(held == rollout_id for held in ray.get([role.trained_rollout_id.remote() for role in roles]))

    def wait(self, refs):
        """Block until the referenced results are ready and return them (the sync driver's ``await``). A list is
        awaited in order, so a failure is reported as the earliest step's: the guard's, not the ``train`` that
        failed after it (``ray.get`` of a list would raise whichever failure arrived first)."""
        results = get_in_order(refs) if isinstance(refs, list) else ray.get(refs)
        self._settle(refs if isinstance(refs, list) else [refs])
        return results

    async def settled(self, push) -> None:
        """Await an earlier push that nothing else waits for, in order, so its failure surfaces here."""
        if push is not None:
            for ref in push:
                await ref
            self._settle(push)

    def _track(self, key: tuple[str, int], refs: list) -> list:
        self.unsettled.setdefault(key, []).extend(refs)
        return refs

    def _settle(self, refs: list) -> None:
        settled = {id(ref) for ref in refs}
        for key in list(self.unsettled):
            self.unsettled[key] = [ref for ref in self.unsettled[key] if id(ref) not in settled]
            if not self.unsettled[key]:
                del self.unsettled[key]

    def release_unsettled(self, timeout_s: float = 60.0) -> None:
        """After a stop: await every step still unsettled, ignoring their errors (each one only follows the stop's
        cause, which the run reports), so that dropping them prints nothing. Steps still running after
        ``timeout_s`` (a hung process) are dropped as they are."""
        refs = [ref for refs in self.unsettled.values() for ref in refs]
        self.unsettled.clear()
        settle_quietly(refs, timeout_s)

    def rollout_ids(self) -> range:
        return range(self.start_rollout_id, self.args.num_rollout)

    def generate(self, rollout_id: int):
        """(rollout data ref, rollout metrics ref)."""
        refs = self.rollout_manager.generate.options(num_returns=2).remote(rollout_id)
        self._track(("rollout", rollout_id), list(refs))
        return refs

    def train(self, rollout_id: int, rollout_ref, expected_staleness: int) -> list:
        """Refs of the rollout's metrics, the guard's first. The actor first guards the rollout and computes its
        denominator (``prepare``); PPO's critic values (taken before its step) feed both the actor and the critic,
        which steps after the guard passed (its ``train`` takes the guard's ref).

        The actor's ``train`` is submitted at once, without the guard's ref: Ray runs one caller's calls to an actor
        in order, so it runs right after ``prepare`` in the actor's process, not after a trip through the driver.
        If the guard failed, ``train`` finds no prepared rollout and fails too; the drivers await these refs in
        order, so they report the guard's error."""
        values_ref = self.critic.compute_values.remote(rollout_ref) if self.critic is not None else None
        refs = [self.actor.prepare.remote(rollout_id, rollout_ref, expected_staleness, values_ref)]
        if self.critic is not None:
            refs.append(self.critic.train.remote(rollout_id, rollout_ref, values_ref, refs[0]))
        critic_only = self.critic is not None and rollout_id < self.args.num_critic_only_steps
        if not critic_only:
            refs.append(self.actor.train.remote(rollout_id))
        self._track(("rollout", rollout_id), refs + ([values_ref] if values_ref is not None else []))
        return refs

    def update_weights(self, rollouts_trained: int):
        """Push the actor's weights, trained on ``rollouts_trained`` rollouts, to the engines as the next version,
        through the object store. Submitted with the training, not after it: the actor exports once its
        ``train`` ran (Ray's order), and refuses to if that training failed (``PolicyTrainer.export_weights``)."""
        return self._track(("push", rollouts_trained),
                           push_weights(self.rollout_manager, self.actor, rollouts_trained, after_training=True))

    def finish_rollout(self, rollout_id: int, metrics: list[dict]) -> None:
        """Save and evaluate when due, log the rollout's metrics, and stop if the policy drifted past --max-behavior-kl.

        The driver's own time is reported too: ``perf/eval_s`` and ``perf/save_s`` on the rollouts that evaluate or
        save, and ``perf/last_log_s``, the previous rollout's logging (metrics.jsonl, TensorBoard, progress bar)."""
        merged = {name: value for part in metrics for name, value in part.items()}
        if self.stop_after_rollout is None and self._stop_requested(rollout_id):
            self.stop_after_rollout = rollout_id
        if self._due(self.args.eval_interval, rollout_id):
            start = time.perf_counter()
            merged.update(ray.get(self.rollout_manager.evaluate.remote(rollout_id)))
            merged["perf/eval_s"] = time.perf_counter() - start
        if self.args.save and (self._due(self.args.save_interval, rollout_id) or self.is_last(rollout_id)):
            start = time.perf_counter()
            self.save(rollout_id)
            merged["perf/save_s"] = time.perf_counter() - start
        if self.last_log_s is not None:
            merged["perf/last_log_s"] = self.last_log_s
        start = time.perf_counter()
        self.tracker.log(rollout_id, merged)
        self.last_log_s = time.perf_counter() - start
        self.last_finished_rollout = rollout_id
        for key in [key for key in self.unsettled if key[0] == "rollout" and key[1] <= rollout_id]:
            del self.unsettled[key]  # its metrics were awaited: every step of the rollout succeeded
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
        return rollout_id == self.stop_after_rollout

    def _stop_requested(self, rollout_id: int) -> bool:
        """A first SIGINT/SIGTERM arrived, or --debug-exit-after-rollout is reached."""
        debug_exit = self.args.debug_exit_after_rollout
        return self.stop_request.signum is not None or (debug_exit is not None and rollout_id >= debug_exit)

    def _due(self, interval: int | None, rollout_id: int) -> bool:
        return bool(interval) and (rollout_id + 1) % interval == 0

    def is_last(self, rollout_id: int) -> bool:
        """No rollout follows this one (the last of --num-rollout, or --debug-exit-after-rollout's)."""
        return rollout_id == self.args.num_rollout - 1 or self.should_stop(rollout_id)


def settle_quietly(refs: list, timeout_s: float = 60.0) -> None:
    """Await ``refs`` (at most ``timeout_s`` in all), ignoring their errors: steps that only follow a failure."""
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s, fetch_local=False) if refs else ([], [])
    for ref in ready:
        with contextlib.suppress(Exception):
            ray.get(ref)


def get_in_order(refs: list) -> list:
    """The results of ``refs`` awaited in order; on the first failure the later ones are settled quietly (they
    follow it) and that failure is raised."""
    results = []
    for index, ref in enumerate(refs):
        try:
            results.append(ray.get(ref))
        except Exception:
            settle_quietly(refs[index + 1:])
            raise
    return results


_ROLE_OF_CLASS = {"TorchRolloutEngine": "a rollout engine", "SGLangRolloutEngine": "an SGLang rollout engine",
                   "RolloutManager": "the rollout manager"}


def checkpoint_note(args, saved_now: bool = False) -> str:
    """What --save holds now, the user's next step after a stop."""
    latest = checkpoint.latest_rollout_id(args.save) if args.save else None
    if not args.save:
        return "Nothing is saved (no --save)."
    if latest is None:
        return f"No checkpoint in --save {args.save} yet."
    return (f"{'Saved' if saved_now else 'The latest checkpoint is'} rollout {latest} in {args.save}; resume with "
            f"--load {args.save}.")


def _process_died(error: Exception, args, last_finished_rollout: int | None, roles: list) -> ProcessDiedError | None:
    """One line for a Ray process that died mid-run, or None when ``error`` is not that: a train rank found dead,
    else the role Ray reports for the dead actor's class (an engine, the manager)."""
    if not (dead := dead_rank_names(roles)):
        if getattr(error, "actor_init_failed", False) or not isinstance(
                error, (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError)):
            return None  # an error in an actor's __init__ (run_cli reports it as the error it is), or a task's error
        classes = re.findall(r"class_name: (\w+)", str(error))
        dead = [_ROLE_OF_CLASS.get(classes[0], classes[0]) if classes else "a process that held the run's data"]
    when = "during start-up" if last_finished_rollout is None else f"after rollout {last_finished_rollout}"
    return ProcessDiedError(f"{' and '.join(dead)} process died {when}; the run stopped. {checkpoint_note(args)}")


def push_weights(rollout_manager, actor, rollouts_trained: int, after_training: bool) -> list:
    """The actor exports its weights as the next version and the engines load them: [export ref, load ref], to be
    awaited in that order. ``after_training``: the export follows the training of rollout ``rollouts_trained - 1``
    (the start-up push follows none). The export's reference goes to the RolloutManager inside a list, so Ray
    passes it on to the engines instead of fetching the weights into the manager (``RolloutManager.load_weights``);
    the driver owns it and awaits it too, so a refused export is never an unawaited error."""
    export = actor.export_weights.remote(rollouts_trained, after_training)
    return [export, rollout_manager.load_weights.remote([export])]


def _create_train_roles(args, roles: list) -> tuple[TrainRole, TrainRole | None]:
    """The actor's ranks and, for PPO, the critic's, each in its own placement group, their processes starting (not
    awaited: ``start_roles``). ``roles`` collects them for release."""
    for layout in train_layouts(args):
        roles.append(TrainRole(PolicyTrainer if layout.role == "actor" else ValueTrainer, args, layout,
                               args.ray_placement_timeout))
    return roles[0], (roles[1] if len(roles) > 1 else None)


def _derive_num_rollout(args, num_prompts: int) -> None:
    if args.num_epoch is not None:
        args.num_rollout = math.ceil(args.num_epoch * num_prompts / args.rollout_batch_size)
        logger.info("derived num_rollout = %d (from --num-epoch %d over %d prompts)",
                    args.num_rollout, args.num_epoch, num_prompts)
        check_lr_schedules(args)  # the schedule's length is the run's, known only now


@contextlib.contextmanager
def training_run(args, driver: str):
    resolve_run_paths(args, driver)
    _derive_num_rollout(args, num_prompts=preflight(args))
    check_rollouts_left(args)
    train_ranks = sum(layout.world_size for layout in train_layouts(args))
    stop_request = StopRequest(lambda: checkpoint_note(args))
    # Signals are handled inside the Ray session: ray.init installs Ray's handlers, handled() replaces them.
    with ray_session(args.ray_address, num_cpus=count_bundles(args.rollout_num_engines, train_ranks, args.colocate)), \
            stop_request.handled():
        roles, placement, run = [], None, None
        try:
            actor, critic = _create_train_roles(args, roles)
            placement = create_placement(args.rollout_num_engines, args.colocate, args.ray_placement_timeout,
                                         actor.group, actor.layout.num_nodes)
            # The engines start while the train processes do (each imports torch and loads a model): a run's
            # start-up is the slower of the two, not their sum.
            rollout_manager = create_rollout_manager(args, placement)
            start_roles(roles)
            start_rollout_id = ray.get(actor.init.remote())
            if critic is not None:
                ray.get(critic.init.remote())
            get_in_order(push_weights(rollout_manager, actor, start_rollout_id, after_training=False))
            with MetricsTracker(args.log_dir, args.use_tensorboard, args.num_rollout, start_rollout_id,
                                vars(args), driver, wandb=WandbSettings.from_args(args)) as tracker:
                run = TrainingRun(args, rollout_manager, actor, critic, tracker, start_rollout_id, stop_request)
                try:
                    yield run
                except MilesRunError as error:
                    run.release_unsettled()
                    raise run.stopped(error) from None
            print(format_summary(tracker.close()))
            for path in plot_run(args.log_dir) if args.save_plots else ():
                print(f"plot: {path}")
            if stop_request.signum is not None:
                raise run.interrupted()
        except ray.exceptions.RayError as error:
            if (died := _process_died(error, args, run and run.last_finished_rollout, roles)) is None:
                raise
            raise died from None
        finally:
            if run is not None:
                run.release_unsettled()  # before the actors go: a step they would leave unfinished fails as it dies
            if placement is not None:
                placement.release()
            for role in roles:
                role.release()
