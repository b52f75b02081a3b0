"""The engines behind one router: each engine's HTTP server, then sglang-router in front of them (docs/rollout.md).

``start_engine_servers`` asks every engine to serve and launches the router miles starts (neither awaited: the train
processes start meanwhile, about 0.5 s of a run's start saved); ``route_engines`` waits for the servers and registers
them with the router: the one at ``--sglang-router-ip/--sglang-router-port`` when the launch names one (and removes
them at the end), else miles' own on 127.0.0.1 and a free port, whose address it fills into ``args`` as upstream
does. Either way the run's
``Placement`` owns the end: ``release()`` stops the router miles started (also after a failure or a signal).
"""

from __future__ import annotations

import logging
import os

import ray

from miles.ray.cluster import Placement
from miles.rollout.router import RouterProcess, launch_router, register_workers, remove_workers

logger = logging.getLogger("miles")


def serves_http(args) -> bool:
    """Whether the run puts its engines behind a router: when something in it talks HTTP (a custom generate
    function), the launch names a router or configures one (--sglang-router-*, --router-*), or the engines are
    SGLang's servers. Miles' own rollouts call the engines' actors, so a run with none of these starts neither the
    engines' HTTP fronts nor a router (each costs every run's start a process's or a thread's imports)."""
    return bool(args.custom_generate_function_path or args.sglang_router_ip is not None or args.sglang_router_policy
                or getattr(args, "router_words", None) or args.rollout_backend == "sglang")


def start_engine_servers(args, placement: Placement) -> tuple[list, RouterProcess | None]:
    """One ``start_server`` reference per engine (each answers its server's URL), and the router miles starts, its
    process launched now, so it comes up while the train processes start (None when the launch names a router)."""
    servers = [engine.start_server.remote(args.sampling_logprobs) for engine in placement.engines]
    if args.sglang_router_ip is not None:  # with its port: miles_validate_args checks that both are given
        return servers, None
    os.makedirs(args.log_dir, exist_ok=True)
    router = launch_router(router_words(args), os.path.join(args.log_dir, "sglang_router.log"))

    def stop() -> None:
        router.stop()
        args.sglang_router_ip = args.sglang_router_port = None  # a next run with these args starts its own

    placement.stoppers.append(stop)  # also when the run fails before its engines are routed
    return servers, router


def router_words(args) -> list[str]:
    """sglang-router's words: the launch's --router-* options, then upstream's --sglang-router-policy and
    --sglang-router-request-timeout-secs, which win over them as upstream's do (round robin without a policy)."""
    words = list(getattr(args, "router_cli_words", []))
    if args.sglang_router_policy:
        words += ["--policy", args.sglang_router_policy]
    return [*words, "--request-timeout-secs", str(args.sglang_router_request_timeout_secs)]


def route_engines(args, placement: Placement, rollout_manager, started: tuple[list, RouterProcess | None]) -> None:
    """Put the engines' servers behind the router and tell the rollout manager its address."""
    servers, router = started
    urls = ray.get(servers)
    timeout_s = args.rollout_engine_start_timeout
    if router is None:  # the launch named its router (both its ip and port: miles_validate_args checks it)
        router_url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
        register_workers(router_url, urls, timeout_s)
        placement.stoppers.append(lambda: remove_workers(router_url, urls))
        logger.info("engines %s registered with the router at %s", urls, router_url)
    else:
        router.wait_until_ready([], timeout_s)
        register_workers(router.url, urls, timeout_s)
        args.sglang_router_ip, args.sglang_router_port = router.ip, router.port
        logger.info("sglang-router (pid %d) at %s in front of %s", router.pid, router.url, urls)
    ray.get(rollout_manager.set_router.remote(args.sglang_router_ip, args.sglang_router_port))
