"""SGLang's router (the ``sglang-router`` wheel, 0.3.2) in front of the rollout engines' HTTP servers ("workers").

miles starts one (``launch_router`` while the run starts, then ``register_workers``; ``start_router`` does both for
a known fleet; it owns its end) or adds its workers to the user's (``register_workers``, then ``remove_workers``). What the router asks of a worker, recorded by tests/fast/rollout/test_router.py:

- Registration (``--worker-urls``, or ``POST /workers {"url": ...}``): ``GET /health`` must answer 2xx (two HTTP/2
  gRPC probes, ``PRI *``, come with it: uvicorn logs them as invalid requests); then ``GET /server_info`` (``GET
  /get_server_info`` after a non-2xx, logged as deprecated) and ``GET /model_info`` (then ``GET /get_model_info``).
  All four info calls are optional (a 404 registers model "unknown"); ``served_model_name`` becomes the model id,
  and a ``model_path``/``tokenizer_path`` there makes the router load that tokenizer (from the Hub unless local).
- Health: ``GET /health`` every ``--health-check-interval-secs`` (60); ``--health-failure-threshold`` (3) non-2xx
  answers take the worker out of routing until it answers again.
- ``POST /generate`` is parsed and serialized again: fields it does not know are dropped (``return_routed_experts``,
  ``weight_version``, ``routed_dp_rank``; in ``sampling_params`` ``custom_params``, ``logit_bias``, ``stop_regex``,
  ``spaces_between_special_tokens``), defaults added (``"model": null``, ``"stream": false``, ``"log_metrics": true``,
  ``false`` for ``return_hidden_states``, ``return_entropy``, ``return_bytes``, ``background``, ``no_logs``,
  ``return_text_in_logprobs``); a list ``text`` or list of ``sampling_params`` is refused (422). The worker's answer
  comes back byte for byte. A 5xx answer is retried up to ``--retry-max-retries`` (5) times; a 4xx is not.
- ``POST /flush_cache`` goes to every worker (empty body), ``GET /get_loads`` to each ``GET /get_load``, ``GET
  /engine_metrics`` to each ``GET /metrics``, ``GET /get_model_info`` to one. ``/abort_request`` and
  ``/update_weights_*`` are not routed (404): miles calls each engine for those.

The router's own API: ``GET /health`` is 200 once it listens, before any worker is registered; ``GET /workers`` is
``{"workers": [{"id", "url", "is_healthy", ...}]}``; ``POST /workers`` answers 202 and registers in the background;
``DELETE /workers/{id}`` takes the id, not the URL. A worker that never answers is retried for
``--worker-startup-timeout-secs`` and dropped while the router serves the rest: so miles checks every worker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time

import httpx

from miles.utils.errors import MilesConfigError, RolloutEngineError
from miles.utils.http_utils import free_port

HOST = "127.0.0.1"
HTTP_TIMEOUT_S = 2.0  # one call to the router; a wait's deadline caps it further
POLL_S = 0.05
STOP_GRACE_S = 5.0  # after SIGTERM, then after SIGKILL; the router's own grace for in-flight requests is 180 s
LOG_TAIL_LINES = 3
OWNED_WORDS = ("--host", "--port", "--worker-urls")
# ``python -m sglang_router.launch_router`` with the optional ``sglang`` import blocked: launch_router imports the
# Python debugging balancer (mini_lb), which imports all of SGLang for tracing when installed: 4 of 4.5 s of a start.
LAUNCH = ("import runpy, sys; sys.modules['sglang'] = None; "
          "runpy.run_module('sglang_router.launch_router', run_name='__main__', alter_sys=True)")
COLOURS, RUST_PATHS = re.compile(r"\x1b\[[0-9;]*m"), re.compile(r"\S*/src/\S+\.rs:\d+:\s*")
logger = logging.getLogger(__name__)


class RouterProcess:
    """One sglang-router subprocess miles started (it owns the process's end)."""

    def __init__(self, proc: subprocess.Popen, ip: str, port: int, log_path: str | None = None) -> None:
        self._proc, self.ip, self.port, self.pid, self.log_path = proc, ip, port, proc.pid, log_path

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.port}"

    def stop(self) -> None:
        """SIGTERM to the process group it leads, SIGKILL after ``STOP_GRACE_S``; a second call does nothing. The
        group is signalled only while its leader is unreaped, so the id cannot name another process's group."""
        if self._proc.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)
            try:
                self._proc.wait(STOP_GRACE_S)
                return
            except subprocess.TimeoutExpired:
                pass
        logger.warning("sglang-router pid %d survived SIGKILL for %.0f s", self.pid, STOP_GRACE_S)

    def wait_until_ready(self, worker_urls: list[str], timeout_s: float) -> None:
        """Return once the router answers and lists every one of ``worker_urls`` healthy; else stop it and raise
        one ``RolloutEngineError`` line with the tail of its log."""
        try:
            missing = _wait_ready(self.url, worker_urls, timeout_s, self._proc)
        except BaseException:
            self.stop()
            raise
        if missing is not None:
            self.stop()
            raise RolloutEngineError(_failure(self.url, missing, timeout_s) + f"; {_log_tail(self.log_path)}")

    def __enter__(self) -> RouterProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def check_router_words(words: list[str]) -> tuple[list[str], dict]:
    """Upstream's ``--router-NAME`` words checked by sglang-router's own parser (``RouterArgs``, upstream's prefix):
    (sglang-router's CLI words, ``--NAME``, for ``start_router``; every ``router_*`` value, as upstream's ``args``
    carries them). An unknown option or a bad value is one ``MilesConfigError``."""
    import argparse

    from sglang_router.router_args import RouterArgs

    parser = argparse.ArgumentParser(prog="sglang-router", add_help=False, exit_on_error=False)
    RouterArgs.add_cli_args(parser, use_router_prefix=True, exclude_host_port=True)
    try:
        values, unknown = parser.parse_known_args(words)
    except (argparse.ArgumentError, SystemExit) as error:
        raise MilesConfigError(f"sglang-router's options {' '.join(words)}: {error}") from None
    if unknown:
        raise MilesConfigError(f"{' '.join(unknown)}: not an option of sglang-router 0.3.2 (upstream's --router-NAME "
                               "spelling of its --NAME); see python -m sglang_router.launch_router --help")
    cli_words = [f"--{word[len('--router-'):]}" if word.startswith("--router-") else word for word in words]
    return cli_words, {dest: value for dest, value in vars(values).items() if dest.startswith("router_")}


def start_router(worker_urls: list[str], router_words: list[str], timeout_s: float,
                 log_path: str | None = None) -> RouterProcess:
    """Start sglang-router on 127.0.0.1 in front of ``worker_urls``; return once it lists every worker healthy."""
    router = launch_router(router_words, log_path, worker_urls)
    router.wait_until_ready(worker_urls, timeout_s)
    return router


def launch_router(router_words: list[str], log_path: str | None = None,
                  worker_urls: list[str] = ()) -> RouterProcess:
    """Start sglang-router's process on 127.0.0.1 and a free port, without waiting for it (the run starts it while
    its train processes start, then waits: ``RouterProcess.wait_until_ready``).

    ``router_words`` are sglang-router's own CLI words, passed through after miles's defaults for the words they
    leave out: ``--policy round_robin`` (deterministic spreading), ``--log-level warn``, and Prometheus on a free
    127.0.0.1 port (its default, 0.0.0.0:29000, makes a second router on the node die: "Address already in use").
    """
    owned = [word for word in router_words if word.split("=")[0] in OWNED_WORDS]
    if owned:
        raise MilesConfigError(f"router words {owned}: miles sets {', '.join(OWNED_WORDS)} itself; remove them")
    port = free_port()
    argv = [sys.executable, "-c", LAUNCH, "--host", HOST, "--port", str(port), *_default_words(router_words),
            *router_words, *(["--worker-urls", *worker_urls] if worker_urls else [])]
    with open(log_path, "wb") if log_path else contextlib.nullcontext(subprocess.DEVNULL) as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_die_with_parent)
    return RouterProcess(proc, HOST, port, log_path)


def register_workers(router_url: str, worker_urls: list[str], timeout_s: float) -> None:
    """Add ``worker_urls`` to a running router (the launch's, or miles' own once it answers); return once it lists
    them healthy. Workers it lists already are not posted again (it would answer 202 and drop the duplicate in the
    background)."""
    deadline = time.monotonic() + timeout_s
    try:
        with httpx.Client(timeout=HTTP_TIMEOUT_S) as client:
            listed = _listed(client, router_url)
            for url in worker_urls:
                if _normal(url) not in listed:
                    client.post(f"{router_url}/workers", json={"url": url}).raise_for_status()
    except (httpx.HTTPError, ValueError, KeyError) as error:
        raise RolloutEngineError(f"sglang-router at {router_url} did not take workers {' '.join(worker_urls)}: "
                                 f"{type(error).__name__}: {_first_line(error)}") from None
    missing = _wait_ready(router_url, worker_urls, max(0.0, deadline - time.monotonic()))
    if missing is not None:
        raise RolloutEngineError(_failure(router_url, missing, timeout_s))


def remove_workers(router_url: str, worker_urls: list[str]) -> None:
    """Take miles's workers off a router miles did not start, at the end of a run: best effort, failures logged.
    The router deletes by its own worker id, so the ids come from its list."""
    with httpx.Client(timeout=HTTP_TIMEOUT_S) as client:
        try:
            ids = {_normal(w["url"]): w["id"] for w in client.get(f"{router_url}/workers").json()["workers"]}
        except (httpx.HTTPError, ValueError, KeyError) as error:
            logger.warning("sglang-router at %s: no worker list (%s); workers left there: %s", router_url,
                           _first_line(error), " ".join(worker_urls))
            return
        for url in worker_urls:
            try:
                if _normal(url) in ids:
                    client.delete(f"{router_url}/workers/{ids[_normal(url)]}").raise_for_status()
            except httpx.HTTPError as error:
                logger.warning("sglang-router at %s: worker %s not removed (%s)", router_url, url, _first_line(error))


def _die_with_parent() -> None:
    """In the router's process before it starts: the kernel kills it when miles' process dies, even by SIGKILL
    (Linux's PR_SET_PDEATHSIG; elsewhere ``stop()`` is the only end)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def _default_words(router_words: list[str]) -> list[str]:
    defaults = {"--policy": "round_robin", "--log-level": "warn", "--prometheus-port": str(free_port()),
                "--prometheus-host": HOST}
    given = {word.split("=")[0] for word in router_words}
    return [word for flag, value in defaults.items() if flag not in given for word in (flag, value)]


def _normal(url: str) -> str:
    """A worker URL as the router lists it, which adds a missing ``http://`` and keeps a trailing slash."""
    return (url if "://" in url else f"http://{url}").rstrip("/")


def _listed(client: httpx.Client, router_url: str, timeout_s: float = HTTP_TIMEOUT_S) -> dict[str, bool]:
    """The router's workers: normalized URL -> healthy."""
    answer = client.get(f"{router_url}/workers", timeout=timeout_s)
    answer.raise_for_status()
    return {_normal(w["url"]): bool(w["is_healthy"]) for w in answer.json()["workers"]}


def _wait_ready(router_url: str, worker_urls: list[str], timeout_s: float,
                proc: subprocess.Popen | None = None) -> str | None:
    """None once the router answers ``GET /health`` and lists every worker healthy (its /health is 200 before
    any is registered); else what was missing when ``timeout_s`` ran out, or that ``proc`` exited."""
    deadline = time.monotonic() + timeout_s
    missing = "no answer to GET /health"
    with httpx.Client() as client:
        for _ in range(int(timeout_s / POLL_S) + 2):  # each round sleeps POLL_S: the deadline comes first
            if proc is not None and proc.poll() is not None:
                return f"it exited with status {proc.returncode}"
            left = max(POLL_S, min(HTTP_TIMEOUT_S, deadline - time.monotonic()))
            try:
                health = client.get(f"{router_url}/health", timeout=left)
                listed = _listed(client, router_url, left) if health.status_code == 200 else {}
                down = [url for url in worker_urls if not listed.get(_normal(url))]
                if health.status_code == 200 and not down:
                    return None
                missing = (f"workers not listed healthy: {' '.join(down)}" if health.status_code == 200
                           else f"GET /health answered {health.status_code}")
            except (httpx.HTTPError, ValueError, KeyError) as error:
                missing = f"no answer to GET /health or /workers ({type(error).__name__})"
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
    return missing


def _first_line(error: Exception) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


def _failure(router_url: str, missing: str, timeout_s: float) -> str:
    return f"sglang-router at {router_url} did not come up within {timeout_s:g} s: {missing}"


def _log_tail(log_path: str | None) -> str:
    """The log's last lines on one line, without colours and Rust source paths (".../src/core/worker.rs:939: ")."""
    if not log_path:
        return "no log (start_router's log_path keeps one)"
    try:
        with open(log_path, "rb") as log:
            log.seek(max(0, os.path.getsize(log_path) - 8192))
            text = log.read().decode(errors="replace")
    except OSError as error:
        return f"log {log_path} unreadable: {error}"
    lines = [RUST_PATHS.sub("", COLOURS.sub("", line)).strip()[:400] for line in text.splitlines() if line.strip()]
    return f"log {log_path}: " + (" | ".join(lines[-LOG_TAIL_LINES:]) or "empty")
