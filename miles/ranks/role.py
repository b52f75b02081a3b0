"""A train role in the driver: its placement group, one Ray actor per rank, and verbs that address it as a whole.

``TrainRole`` reserves one bundle of ``{"CPU": ranks_per_node}`` per node (``STRICT_SPREAD`` across nodes, so
``--actor-num-nodes`` really means nodes), starts a ``RankWorker`` per rank in bundle ``rank // ranks_per_node``,
lets rank 0 pick the rendezvous address, and waits (bounded) until every rank joined the process group and built
its train process. Each verb (``init``, ``prepare``, ``train``, ...) is called on every rank with the same
arguments (object references are resolved by Ray on each rank, so every rank receives the whole rollout) and
returns ONE object reference: rank 0's result once every rank finished, or the first failure. The drivers and
``TrainingRun`` therefore use a role exactly like a single actor, and one rank is the same code path.
"""

from __future__ import annotations

import contextlib
import logging
import os

import ray
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from miles.config.rank_layout import RoleLayout
from miles.ranks.placement import CPUS_PER_BUNDLE, reserve_bundles
from miles.ranks.process_group import COLLECTIVE_TIMEOUT_S, join_process_group, rendezvous_address

logger = logging.getLogger("miles")
VERBS = ("init", "prepare", "train", "compute_values", "export_weights", "save", "model_and_optimizer_state",
         "trained_rollout_id")


class RankWorker:
    """One rank of a role (made remote by ``TrainRole``): joins the role's process group, then holds its train
    process and answers the verbs. Only rank 0's results travel back (the role's result is rank 0's), so a weight
    push, for instance, is sent once."""

    def __init__(self, trainer_class, args, rank: int, world_size: int) -> None:
        self.trainer_class, self.args, self.rank, self.world_size = trainer_class, args, rank, world_size
        self.trainer = None

    def rendezvous_address(self) -> tuple[str, int]:
        return rendezvous_address()

    def start(self, address: str, port: int, timeout_s: float) -> dict:
        """Join the process group and build the train process; return where this rank runs."""
        join_process_group(address, port, self.rank, self.world_size, timeout_s)
        self.trainer = self.trainer_class(self.args, CPUS_PER_BUNDLE)
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def pid(self) -> int:
        return os.getpid()

    def call(self, verb: str, *args, **kwargs):
        result = getattr(self.trainer, verb)(*args, **kwargs)
        return result if self.rank == 0 else None


def rank_worker_class(trainer_class) -> type:
    """A ``RankWorker`` named after ``trainer_class``, with one method per verb: Ray's timeline, process titles and
    error reports then say ``PolicyTrainer.prepare``, as they did for a single actor, not ``RankWorker.call``."""

    def forward(verb: str):
        def method(self, *args, **kwargs):
            return self.call(verb, *args, **kwargs)

        method.__name__ = method.__qualname__ = verb
        return method

    return type(trainer_class.__name__, (RankWorker,), {verb: forward(verb) for verb in VERBS})


@ray.remote(num_cpus=0, max_retries=0)
def _rank_zero_result(*results):
    """Runs once every rank's call succeeded (Ray fails it with the first rank's error otherwise)."""
    return results[0]


class _Verb:
    """``role.train.remote(...)``: the verb on every rank, one reference for the role."""

    def __init__(self, workers: list, name: str) -> None:
        self._workers, self._name = workers, name

    def remote(self, *args, **kwargs):
        refs = [getattr(worker, self._name).remote(*args, **kwargs) for worker in self._workers]
        return refs[0] if len(refs) == 1 else _rank_zero_result.remote(*refs)


class TrainRole:
    """The ranks of one role (``layout``), each running ``trainer_class(args, num_threads)``."""

    def __init__(self, trainer_class, args, layout: RoleLayout, placement_timeout_s: float) -> None:
        self.layout = layout
        strategy = "STRICT_SPREAD" if layout.num_nodes > 1 else "PACK"
        self.group = reserve_bundles([{"CPU": layout.ranks_per_node * CPUS_PER_BUNDLE}] * layout.num_nodes,
                                     strategy, placement_timeout_s,
                                     f"the {layout.role} ({layout.world_size} rank(s) on {layout.num_nodes} node(s))")
        remote_worker = ray.remote(rank_worker_class(trainer_class))
        self.workers = [
            remote_worker.options(
                num_cpus=CPUS_PER_BUNDLE, max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, layout.bundle_of(rank)),
            ).remote(trainer_class, args, rank, layout.world_size)
            for rank in range(layout.world_size)
        ]
        self.ranks: list[dict] = []  # where each rank runs (node id, pid), once started
        for verb in VERBS:
            setattr(self, verb, _Verb(self.workers, verb))

    def _log_started(self, address: str, port: int) -> None:
        logger.info("%s: %d rank(s) (tensor-parallel %d x data-parallel %d), rendezvous %s:%d, on nodes %s",
                    self.layout.role, self.layout.world_size, self.layout.tensor_parallel_size,
                    self.layout.data_parallel_size, address, port, [rank["node_id"] for rank in self.ranks])

    def dead_ranks(self, timeout_s: float = 5.0) -> list[int]:
        """The ranks whose process has ended (a busy rank that does not answer within ``timeout_s`` is alive)."""
        dead = []
        for rank, worker in enumerate(self.workers):
            try:
                ray.get(worker.pid.remote(), timeout=timeout_s)
            except ray.exceptions.RayActorError:
                dead.append(rank)
            except ray.exceptions.GetTimeoutError:
                pass
        return dead

    def release(self) -> None:
        """Kill every rank and free the role's placement group."""
        for worker in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(worker)
        with contextlib.suppress(Exception):
            remove_placement_group(self.group)


def start_roles(roles: list[TrainRole], collective_timeout_s: float = COLLECTIVE_TIMEOUT_S) -> None:
    """Rendezvous and build every rank's train process of every role, all at once (each loads its model while the
    others do); a rank that cannot join fails this within the timeout."""
    addresses = ray.get([role.workers[0].rendezvous_address.remote() for role in roles])
    started = [[worker.start.remote(address, port, collective_timeout_s) for worker in role.workers]
               for role, (address, port) in zip(roles, addresses, strict=True)]
    for role, refs, (address, port) in zip(roles, started, addresses, strict=True):
        role.ranks = ray.get(refs)
        role._log_started(address, port)


ROLE_NAMES = {"actor": "the actor (policy trainer)", "critic": "the critic"}


def dead_rank_names(roles: list[TrainRole]) -> list[str]:
    """After a Ray error: the ranks whose process is gone (killed, out of memory, its node lost), named for the
    user ("the critic", "the actor's rank 1 (pid 4242)"); empty when every rank is alive. The peers' own errors
    (e.g. gloo's "connection closed") are only the consequence. Call it before the roles are released."""
    names = []
    for role in roles:
        for rank in role.dead_ranks():
            name = ROLE_NAMES.get(role.layout.role, role.layout.role)
            if role.layout.world_size > 1:
                pid = role.ranks[rank]["pid"] if role.ranks else "?"
                name = f"{name.removesuffix(' (policy trainer)')}'s rank {rank} (pid {pid})"
            names.append(name)
    return names
