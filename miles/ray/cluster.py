"""Ray session and the engines' placement: a placement group of CPU bundles for the rollout engines (each train
role reserves its own through ``miles.ranks.placement``, which this module builds on), actors pinned to their bundle.

Resources are logical: a local cluster is started with at least as many logical CPUs as the run has bundles, so
every configuration (PPO: engines + actor ranks + critic ranks) fits on a 2-core machine, and each actor pins its torch
threads to its bundle's share. A placement group that cannot be satisfied (a joined cluster too small) fails with
a clear error after ``--ray-placement-timeout`` seconds instead of hanging.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import ray
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from miles.ranks.placement import CPUS_PER_BUNDLE, reserve_bundles

SHUTDOWN_TIMEOUT_S = 30.0  # an engine with processes of its own (SGLang) gets this long to stop them


@contextlib.contextmanager
def ray_session(address: str | None, num_cpus: int):
    """Join ``address`` (or $RAY_ADDRESS), or start a local cluster; shut it down on every exit path if we started it.

    An already initialized Ray (a test session, a notebook) is used as is and left running.
    """
    if ray.is_initialized():
        yield
        return
    address = address or os.environ.get("RAY_ADDRESS")
    # "local" starts a new cluster even when another one runs on this machine: ray.init() alone would try to join
    # that one and fail ("num_cpus must not be provided"), so a second run beside a first would crash.
    local = {} if address else {"num_cpus": max(num_cpus, os.cpu_count() or 1), "include_dashboard": False}
    ray.init(address=address or "local", logging_level="WARNING", log_to_driver=True, **local)
    try:
        yield
    finally:
        ray.shutdown()


@dataclass
class Placement:
    """The rollout engines' placement group and each engine's bundle; ``release()`` frees all of it.

    The train roles have placement groups of their own (``miles.ranks.role``); colocated engines are placed in the
    actor's (round-robin over its nodes' bundles), so then ``group`` is the actor's group.
    """

    group: object
    engine_bundles: list[int]
    actors: list = field(default_factory=list)  # handles created outside the group, killed on release
    engines: list = field(default_factory=list)  # the rollout engines' handles (also in ``actors``)
    stoppers: list = field(default_factory=list)  # what else the run started (the router): stopped first on release

    def strategy(self, bundle: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(placement_group=self.group, placement_group_bundle_index=bundle)

    def release(self) -> None:
        for stop in self.stoppers:
            with contextlib.suppress(Exception):
                stop()
        for handle in self.actors:  # an engine with processes of its own (SGLang) stops them first
            if hasattr(handle, "shutdown"):
                with contextlib.suppress(Exception):
                    ray.get(handle.shutdown.remote(), timeout=SHUTDOWN_TIMEOUT_S)
        for handle in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(handle)
        with contextlib.suppress(Exception):
            remove_placement_group(self.group)  # kills every actor scheduled in it


def count_bundles(num_engines: int, num_train_ranks: int, colocate: bool) -> int:
    """CPU bundles of a run: one per engine (none when colocated: engines share the actor's) and per train rank."""
    return (0 if colocate else num_engines) + num_train_ranks


def create_placement(num_engines: int, colocate: bool, timeout_s: float, actor_group, actor_nodes: int) -> Placement:
    """One bundle per engine, packed; colocated engines share the actor's bundles (one per node), round-robin."""
    if colocate:
        return Placement(actor_group, [engine % actor_nodes for engine in range(num_engines)])
    group = reserve_bundles([{"CPU": CPUS_PER_BUNDLE}] * num_engines, "PACK", timeout_s,
                            f"the run's {num_engines} rollout engine(s)")
    return Placement(group, list(range(num_engines)))
