"""Ray session and placement: one placement group of CPU bundles, actors pinned to their bundle.

Resources are logical: a local cluster is started with at least as many logical CPUs as the run has bundles, so
every configuration (PPO: engines + actor + critic) fits on a 2-core machine, and each actor pins its torch
threads to its bundle's share. A placement group that cannot be satisfied (a joined cluster too small) fails with
a clear error after ``--ray-placement-timeout`` seconds instead of hanging.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from miles.utils.errors import MilesConfigError

CPUS_PER_BUNDLE = 1


@contextlib.contextmanager
def ray_session(address: str | None, num_cpus: int):
    """Join ``address`` (or $RAY_ADDRESS), or start a local cluster; shut it down on every exit path if we started it.

    An already initialized Ray (a test session, a notebook) is used as is and left running.
    """
    if ray.is_initialized():
        yield
        return
    address = address or os.environ.get("RAY_ADDRESS")
    local = {} if address else {"num_cpus": max(num_cpus, os.cpu_count() or 1), "include_dashboard": False}
    ray.init(address=address, logging_level="WARNING", log_to_driver=True, **local)
    try:
        yield
    finally:
        ray.shutdown()


@dataclass
class Placement:
    """The run's placement group and the bundle index of each role; ``release()`` frees all of it."""

    group: object
    engine_bundles: list[int]
    actor_bundle: int
    critic_bundle: int | None
    actors: list = field(default_factory=list)  # handles created outside the group, killed on release

    def strategy(self, bundle: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(placement_group=self.group, placement_group_bundle_index=bundle)

    def release(self) -> None:
        for handle in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(handle)
        with contextlib.suppress(Exception):
            remove_placement_group(self.group)  # kills every actor scheduled in it


def count_bundles(num_engines: int, use_critic: bool, colocate: bool) -> int:
    return (0 if colocate else num_engines) + 1 + int(use_critic)


def create_placement(num_engines: int, use_critic: bool, colocate: bool, timeout_s: float) -> Placement:
    """Bundles: one per engine (none when colocated: engines share the actor's), the actor, the critic (PPO)."""
    num_bundles = count_bundles(num_engines, use_critic, colocate)
    group = placement_group([{"CPU": CPUS_PER_BUNDLE}] * num_bundles, strategy="PACK")
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        available = ray.cluster_resources().get("CPU", 0)
        raise MilesConfigError(
            f"the run needs {num_bundles} CPU bundles ({num_engines} rollout engine(s), the actor"
            f"{', the critic' if use_critic else ''}) but Ray could not place them within --ray-placement-timeout "
            f"{timeout_s:g} s; the cluster has {available:g} logical CPUs. Lower --rollout-num-engines, or join a "
            "larger cluster (--ray-address)."
        ) from None
    engine_bundles = [0] * num_engines if colocate else list(range(num_engines))
    actor_bundle = 0 if colocate else num_engines
    critic_bundle = actor_bundle + 1 if use_critic else None
    return Placement(group, engine_bundles, actor_bundle, critic_bundle)
