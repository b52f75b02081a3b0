"""The process group of a train role's ranks: rank 0 picks the rendezvous address, every rank joins with a bound.

Rank 0 takes its node's IP and a free port, the driver passes them to every rank, and each rank joins with
``torch.distributed.init_process_group`` over TCP: gloo without CUDA, nccl with it. The timeout bounds both the
join (a rank that never comes) and every collective on the default group (a rank that died mid-step), so a broken
group ends the run with an error instead of a hang.
"""

from __future__ import annotations

import datetime
import socket

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT_S = 60.0


def rendezvous_address() -> tuple[str, int]:
    """This node's IP (as Ray sees it, so other nodes can reach it) and a port free on it now."""
    import ray

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    return ray.util.get_node_ip_address(), port


def join_process_group(address: str, port: int, rank: int, world_size: int, timeout_s: float) -> None:
    """Join the role's default process group as ``rank`` of ``world_size``."""
    dist.init_process_group(
        "nccl" if torch.cuda.is_available() else "gloo",
        init_method=f"tcp://{address}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
