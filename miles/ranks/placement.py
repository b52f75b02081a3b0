"""Reserving CPU bundles in Ray: a placement group that is ready, or a clear error instead of a hang.

In ``miles.ranks`` because a train role reserves its own group (``role.py``); the Ray session and the engines'
placement (``miles.ray.cluster``) build on this, so the run's package imports the ranks' and never the reverse.
"""

from __future__ import annotations

import ray
from ray.util.placement_group import placement_group, remove_placement_group

from miles.utils.errors import MilesConfigError

CPUS_PER_BUNDLE = 1  # logical CPUs per rank or engine: each actor pins its torch threads to its bundle's share


def reserve_bundles(bundles: list[dict], strategy: str, timeout_s: float, what: str):
    """A ready placement group of ``bundles``, or a ``MilesConfigError`` after ``timeout_s`` naming ``what`` needed
    them (the group is removed then, so nothing waits on in the cluster)."""
    group = placement_group(bundles, strategy=strategy)
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
        raise MilesConfigError(
            f"{what} needs the bundles {bundles} ({strategy}) but Ray could not place them within "
            f"--ray-placement-timeout {timeout_s:g} s; the cluster has {ray.cluster_resources().get('CPU', 0):g} "
            f"logical CPUs on {nodes} node(s). Ask for fewer engines or ranks, or join a larger cluster "
            "(--ray-address)."
        ) from None
    return group
