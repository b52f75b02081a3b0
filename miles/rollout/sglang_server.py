"""One SGLang HTTP server process: SGLang's own launch entry point (``sglang.srt.entrypoints.http_server.
launch_server``), started by the SGLang rollout engine's Ray actor and ended by it (docs/sglang.md, docs/rollout.md).

The process is a ``spawn`` child of the engine's actor, as upstream starts its servers: it inherits the actor's
``sys.path`` (the CPU stand-ins, ``miles.rollout.sglang_shims``) and its multiprocessing auth key, so the tensors of
a push pass to SGLang's scheduler as shared-memory handles (``/update_weights_from_tensor``), as they did to the
in-process engine. It dies with the actor (``kill_itself_when_parent_died``); ``stop()`` ends it and the scheduler and
detokenizer processes it spawned (its process tree), also after a failed start.

The actor talks to it with a plain ``httpx.Client``: one call at a time (the actor's lock), each bounded by a
time-out.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time

import httpx

from miles.utils.errors import RolloutEngineError
from miles.utils.http_utils import free_port

PROCESS_TITLE = "miles::sglang_server"  # in ps and psutil, beside SGLang's own sglang::scheduler_0
POLL_S = 0.25
STOP_GRACE_S = 10.0
REQUEST_TIMEOUT_S = 600.0  # one generate or weight-update call of the actor; longer means the server hangs


def serve(server_kwargs: dict) -> None:
    """The server process's target: SGLang's HTTP server on ``server_kwargs`` (``ServerArgs`` fields)."""
    from sglang.srt.utils.common import kill_itself_when_parent_died

    kill_itself_when_parent_died()
    import setproctitle

    setproctitle.setproctitle(PROCESS_TITLE)  # its scheduler and detokenizer are sglang::scheduler_0, ...
    if server_kwargs.get("device") == "cpu":
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"  # SGLang's torch-native CPU path (no sgl_kernel ops)
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import ServerArgs

    launch_server(ServerArgs(**server_kwargs))


class SGLangServerProcess:
    """SGLang's server on ``host`` and a free port, up (``/health_generate`` answers) within ``timeout_s``."""

    def __init__(self, server_kwargs: dict, name: str, timeout_s: float, host: str = "127.0.0.1") -> None:
        self.name = name
        self.url = f"http://{host}:{free_port(host)}"
        port = int(self.url.rsplit(":", 1)[1])
        self.process = multiprocessing.get_context("spawn").Process(
            target=serve, args=({**server_kwargs, "host": host, "port": port},), name="sglang-server", daemon=False)
        self.process.start()
        self.client = httpx.Client(base_url=self.url, timeout=httpx.Timeout(REQUEST_TIMEOUT_S))
        try:
            self._wait_until_up(timeout_s)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    def _wait_until_up(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.process.is_alive():
                raise RolloutEngineError(f"{self.name}: SGLang's server process exited with code "
                                         f"{self.process.exitcode} while starting on {self.url} (its log is above)")
            try:
                if self.client.get("/health_generate", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(POLL_S)
        raise RolloutEngineError(f"{self.name}: SGLang's server did not answer /health_generate on {self.url} "
                                 f"within --rollout-engine-start-timeout {timeout_s:g} s")

    def call(self, path: str, body: dict | None = None) -> tuple[int, dict | list]:
        """POST ``body`` to ``path``: (HTTP status, JSON answer); a server that does not answer is one line."""
        try:
            response = self.client.post(path, json=body or {})
        except httpx.HTTPError as error:
            raise RolloutEngineError(f"{self.name}: POST {self.url}{path} failed: {type(error).__name__}: "
                                     f"{error}") from None
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, {"message": response.text}

    def stop(self) -> None:
        """End the server and every process it spawned (idempotent): SIGTERM to the server, whose handler ends its
        scheduler and detokenizer; whatever is left of the tree after ``STOP_GRACE_S`` is killed."""
        import psutil

        self.client.close()
        if self.process.pid is None or not self.process.is_alive():
            return
        try:
            server = psutil.Process(self.process.pid)
            tree = [server, *server.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        server.terminate()
        _, alive = psutil.wait_procs(tree, timeout=STOP_GRACE_S)
        for proc in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(alive, timeout=STOP_GRACE_S)
        self.process.join(timeout=STOP_GRACE_S)
