"""HTTP to the rollout engines' router, as upstream's generate functions do it (upstream's import path).

``await post(f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate", payload)`` is how a generate
function asks for a response (docs/rollout.md). One ``httpx.AsyncClient`` per process (made by
``init_http_client(args)``, or at the first call with the default time-out), used from one event loop
(``miles.utils.async_utils.run``).

Retries, as upstream's: a request that cannot connect, or that the server answers 502, 503, 504 or 429, is tried
again after ``RETRY_WAIT_S``, up to ``max_retries`` times (upstream's 60: a router whose worker restarts).
Departures, on purpose: a 4xx or 500 (the request's fault, or the engine's error, such as diverged weights) is
raised at once with the server's message (it would fail the same way 60 times), and a request the server does not
answer within ``--rollout-request-timeout`` seconds is an error naming that flag, never retried (a
hung server must stop the run, not hold it for hours).
"""

from __future__ import annotations

import asyncio
import socket

import httpx

from miles.utils.errors import RolloutEngineError

DEFAULT_TIMEOUT_S = 600.0  # --rollout-request-timeout's default
# Open connections per engine: httpx's pool costs more per request the more connections it juggles; a rollout of 128
# concurrent requests to one torch engine ran at 350 samples/s with 8, 320 with 16, 190 with 32, 110 with 64
# (bench/http_rollout.py, docs/benchmarks.md). The requests beyond them wait in the pool.
CONNECTIONS_PER_ENGINE = 8
RETRY_WAIT_S = 1.0
RETRIED_STATUS = {429, 502, 503, 504}  # a busy or restarting server; a 500 is an engine's error, raised

_client: httpx.AsyncClient | None = None
_timeout_s = DEFAULT_TIMEOUT_S
_max_connections = 2 * CONNECTIONS_PER_ENGINE


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (another process may take it before the server binds it: its start then fails)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def init_http_client(args) -> None:
    """This process's client, with the run's per-request time-out (``--rollout-request-timeout``) and
    ``CONNECTIONS_PER_ENGINE`` connections per rollout engine."""
    global _client, _timeout_s, _max_connections
    _timeout_s = float(getattr(args, "rollout_request_timeout", DEFAULT_TIMEOUT_S))
    _max_connections = CONNECTIONS_PER_ENGINE * max(1, getattr(args, "rollout_num_engines", None) or 1)
    _client = None  # made on the loop that first uses it


def _http_client() -> httpx.AsyncClient:
    global _client
    if _client is None:
        _client = httpx.AsyncClient(timeout=httpx.Timeout(_timeout_s),
                                    limits=httpx.Limits(max_connections=_max_connections))
    return _client


async def post(url: str, payload: dict | None, max_retries: int = 60, action: str = "post",
               headers: dict | None = None):
    """``action`` (post, get, delete) ``url`` with the JSON ``payload``; the answer's JSON (or text)."""
    client = _http_client()
    for attempt in range(1, max_retries + 1):
        try:
            if action in ("get", "delete"):
                response = await getattr(client, action)(url, headers=headers)
            else:
                response = await getattr(client, action)(url, json=payload or {}, headers=headers)
        except httpx.TimeoutException:
            raise RolloutEngineError(f"{action.upper()} {url}: no answer within --rollout-request-timeout "
                                     f"{_timeout_s:g} s; the server hangs or the request is too long for it (raise "
                                     "the flag for long generations).") from None
        except httpx.TransportError as error:
            if attempt == max_retries:
                raise RolloutEngineError(f"{action.upper()} {url}: {type(error).__name__}: {error} ({max_retries} "
                                         "tries); is the router up (--sglang-router-ip/--sglang-router-port)?") from None
            await asyncio.sleep(RETRY_WAIT_S)
            continue
        if response.status_code in RETRIED_STATUS and attempt < max_retries:
            await asyncio.sleep(RETRY_WAIT_S)
            continue
        if response.is_error:
            raise RolloutEngineError(f"{action.upper()} {url}: HTTP {response.status_code}: "
                                     f"{' '.join(response.text.split())[:500]}")
        try:
            return response.json()
        except ValueError:
            return response.text
    raise AssertionError("unreachable: the last attempt returns or raises")


async def get(url: str):
    """GET ``url``: its JSON (upstream's ``get``), with ``post``'s retries and time-out."""
    return await post(url, None, action="get")
