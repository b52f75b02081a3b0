"""sglang-router's lifecycle (miles.rollout.router) against real router processes and tiny recording workers.

Each worker is FastAPI on uvicorn in a thread of this process, on a socket bound to 127.0.0.1:0; it answers only
``GET /health`` and ``POST /generate`` (and ``POST /flush_cache``) and records every request, so the router's calls
to a worker are asserted, not assumed. Every router process a test starts is recorded by the ``spawned`` fixture,
which kills any still alive at the end, passed or failed.
"""

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import fastapi
import httpx
import pytest
import uvicorn

from miles.ray.routing import router_words
from miles.rollout import router as router_module
from miles.rollout.router import check_router_words, register_workers, remove_workers, start_router
from miles.utils.arguments import parse_args
from miles.utils.errors import MilesConfigError, RolloutEngineError
from miles.utils.http_utils import free_port

START_TIMEOUT_S = 10.0


class DummyWorker:
    """A recording stand-in for a rollout engine's HTTP server: the minimal API sglang-router needs."""

    def __init__(self, name: str) -> None:
        self.name, self.calls = name, []  # calls: (method, path, body bytes)
        # what /generate answers, byte for byte: odd key order and float spellings that a re-serialization would change
        self.answer = json.dumps({"text": name, "z": 1, "meta_info": {"finish_reason": {"type": "length"}},
                                  "a": [1.0000000001, 2e-07]}, separators=(",", ":")).encode()
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self._app(), log_level="critical"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def _app(self):
        app = fastapi.FastAPI()

        @app.middleware("http")
        async def record(request, call_next):
            self.calls.append((request.method, request.url.path, await request.body()))
            return await call_next(request)

        app.get("/health")(lambda: fastapi.Response(status_code=200))
        app.post("/generate")(lambda: fastapi.Response(self.answer, media_type="application/json"))
        app.post("/flush_cache")(lambda: fastapi.Response(status_code=200))
        return app

    def paths(self, method: str | None = None) -> list[str]:
        return [path for m, path, _ in self.calls if method in (None, m)]

    def start(self) -> "DummyWorker":
        self.thread.start()
        for _ in range(500):
            if self.server.started:
                return self
            time.sleep(0.01)
        raise RuntimeError(f"dummy worker {self.name} did not start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)
        self.socket.close()


@pytest.fixture
def workers():
    """``make(n) -> [DummyWorker]``, all stopped at the end."""
    made = []

    def make(n: int) -> list[DummyWorker]:
        new = [DummyWorker(f"w{len(made) + i}") for i in range(n)]
        made.extend(new)
        return [worker.start() for worker in new]

    yield make
    for worker in made:
        worker.stop()


@pytest.fixture
def spawned(monkeypatch):
    """Every process started in this test (subprocess.Popen, recorded); any still alive at the end is killed by
    its PID's process group (start_router starts each in a session of its own)."""
    procs, real_popen = [], subprocess.Popen

    def recording_popen(*args, **kwargs):
        procs.append(real_popen(*args, **kwargs))
        return procs[-1]

    monkeypatch.setattr(router_module.subprocess, "Popen", recording_popen)
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:  # as a server would bind it
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
    return True


def _generate(url: str, body: dict) -> httpx.Response:
    answer = httpx.post(f"{url}/generate", json=body, timeout=5)
    assert answer.status_code == 200, answer.text
    return answer


def test_round_robin_over_two_workers_and_the_workers_answer_unchanged(workers, spawned, tmp_path):
    w0, w1 = workers(2)
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, "temperature": 1.0},
            "return_logprob": True}
    with start_router([w0.url, w1.url], [], START_TIMEOUT_S, str(tmp_path / "router.log")) as router:
        answers = [_generate(router.url, body).content for _ in range(8)]
        flush = httpx.post(f"{router.url}/flush_cache", timeout=5)
    assert router.ip == "127.0.0.1" and set(answers) == {w0.answer, w1.answer}  # byte for byte
    assert all(a != b for a, b in zip(answers, answers[1:]))  # round robin alternates
    assert w0.paths("POST").count("/generate") == w1.paths("POST").count("/generate") == 4
    # registration: /health, then /server_info and /model_info, each with its get_ name after a 404 (all four optional)
    assert w0.paths("GET") == ["/health", "/server_info", "/get_server_info", "/model_info", "/get_model_info"]
    forwarded = json.loads(next(raw for m, path, raw in w0.calls if path == "/generate"))
    assert {key: forwarded[key] for key in body} == body  # miles's fields arrive; the router adds its defaults
    assert flush.status_code == 200 and "/flush_cache" in w0.paths() and "/flush_cache" in w1.paths()


def test_the_router_drops_generate_fields_it_does_not_know(workers, spawned):
    """The module docstring's warning, held to the router version installed: not every field reaches a worker."""
    (worker,) = workers(1)
    with start_router([worker.url], [], START_TIMEOUT_S) as router:
        _generate(router.url, {"input_ids": [1], "return_routed_experts": True,
                               "sampling_params": {"custom_params": {}}})
        assert httpx.post(f"{router.url}/abort_request", json={"rid": "x"}, timeout=5).status_code == 404
    forwarded = json.loads(next(raw for m, path, raw in worker.calls if path == "/generate"))
    assert "return_routed_experts" not in forwarded and forwarded["sampling_params"] == {}


def test_stop_ends_the_process_and_frees_its_port(workers, spawned):
    (worker,) = workers(1)
    with start_router([worker.url], ["--policy", "random"], START_TIMEOUT_S) as router:
        assert not _gone(router.pid) and not _port_free(router.port)
    assert _gone(router.pid) and _port_free(router.port)
    router.stop()  # a second stop does nothing
    router = start_router([worker.url], [], START_TIMEOUT_S)
    router.stop()
    assert _gone(router.pid) and _port_free(router.port)


def test_a_worker_that_never_comes_up_is_one_error_within_the_timeout(workers, spawned, tmp_path):
    (worker,) = workers(1)
    dead = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(RolloutEngineError) as raised:
        start_router([worker.url, dead], [], 2.0, str(tmp_path / "router.log"))
    elapsed = time.monotonic() - started
    message = str(raised.value)
    assert elapsed >= 2.0, elapsed  # it waited the time-out out, and then stopped (not the router's 1800 s)
    assert "\n" not in message and dead in message and worker.url not in message and "2 s" in message
    assert len(spawned) == 1 and _gone(spawned[0].pid)


def test_a_bad_router_word_is_one_error_line_and_no_process(spawned, tmp_path):
    started = time.monotonic()
    with pytest.raises(RolloutEngineError) as raised:
        start_router([], ["--policy", "nonsense"], START_TIMEOUT_S, str(tmp_path / "router.log"))
    message = str(raised.value)
    assert "\n" not in message and "did not come up within 10 s: it exited with status 2" in message
    assert "invalid choice: 'nonsense'" in message  # the log's last line
    assert time.monotonic() - started < START_TIMEOUT_S  # the exit is seen, not waited out
    assert len(spawned) == 1 and _gone(spawned[0].pid)


def test_register_and_remove_workers_on_a_router_miles_did_not_start(workers, spawned):
    w0, w1 = workers(2)
    with start_router([w0.url], [], START_TIMEOUT_S) as router:  # stands in for the user's router
        register_workers(router.url, [w1.url], timeout_s=5.0)
        register_workers(router.url, [w0.url, w1.url], timeout_s=5.0)
        time.sleep(0.3)  # a second registration would be in the background: the router would ask w0 for /health again
        assert w0.paths("GET").count("/health") == 1 and w1.paths("GET").count("/health") == 1
        for _ in range(4):
            _generate(router.url, {"input_ids": [1]})
        assert w1.paths("POST").count("/generate") == 2
        with pytest.raises(RolloutEngineError, match="did not come up within 1 s: workers not listed healthy: http"):
            register_workers(router.url, [f"http://127.0.0.1:{free_port()}"], timeout_s=1.0)
        remove_workers(router.url, [w1.url])
        listed = httpx.get(f"{router.url}/workers", timeout=5).json()["workers"]
        assert [w["url"] for w in listed] == [w0.url]
        remove_workers(f"http://127.0.0.1:{free_port()}", [w0.url])  # best effort: no router there, no raise


@pytest.mark.parametrize("words", [["--port=1"], ["--host", "0.0.0.0"], ["--worker-urls", "http://127.0.0.1:1"]])
def test_miles_owns_host_port_and_worker_urls(words, spawned):
    with pytest.raises(MilesConfigError, match=words[0].split("=")[0]):
        start_router([], words, START_TIMEOUT_S)
    assert spawned == []


def test_router_words_are_checked_by_sglang_routers_parser_and_passed_without_the_prefix():
    args = parse_args(argv=["--router-policy", "random", "--router-disable-retries", "--rollout-temperature", "0.5",
                            "--router-prefill", "http://10.0.0.1:8000", "9000", "--sglang-router-policy",
                            "power_of_two"])
    assert args.rollout_temperature == 0.5  # the words around the router's are miles'
    cli_words, values = check_router_words(args.router_words)
    assert cli_words == ["--policy", "random", "--disable-retries", "--prefill", "http://10.0.0.1:8000", "9000"]
    assert values["router_policy"] == "random" and values["router_disable_retries"] is True
    args.router_cli_words = cli_words
    # upstream's --sglang-router-policy and request time-out win over the router's own words, as upstream's do
    assert router_words(args) == [*cli_words, "--policy", "power_of_two", "--request-timeout-secs", "14400"]


@pytest.mark.parametrize(("words", "named"), [(["--router-policy", "nonsense"], "invalid choice: 'nonsense'"),
                                              (["--router-colour", "3"], "--router-colour 3: not an option")])
def test_a_bad_router_word_is_refused_before_anything_starts(words, named):
    with pytest.raises(MilesConfigError, match=named):
        check_router_words(words)


def test_the_router_miles_started_is_stopped_with_the_run_and_its_address_forgotten(workers, spawned, monkeypatch,
                                                                                  tmp_path):
    """``route_engines`` as the run calls it (Ray's ``get`` is the identity here): the address it filled in is
    cleared when the run's placement is released, so a second run with the same ``args`` starts its own router; a
    router the launch named is left running and keeps its address."""
    from miles.ray import routing
    from miles.ray.cluster import Placement

    monkeypatch.setattr(routing.ray, "get", lambda value: value)
    (worker,) = workers(1)

    class Manager:
        def __init__(self):
            self.set_router = self
            self.address = None

        def remote(self, ip, port):
            self.address = (ip, port)

    args = parse_args(argv=["--log-dir", str(tmp_path)])
    args.router_cli_words, manager, placement = [], Manager(), Placement(None, [])
    servers, router_process = routing.start_engine_servers(args, placement)  # no engines: the router alone
    assert servers == [] and (tmp_path / "sglang_router.log").exists()
    routing.route_engines(args, placement, manager, ([worker.url], router_process))
    (router,) = spawned
    assert manager.address == (args.sglang_router_ip, args.sglang_router_port) and router.poll() is None
    placement.stoppers[0]()
    assert router.poll() is not None and (args.sglang_router_ip, args.sglang_router_port) == (None, None)
    with start_router([], [], START_TIMEOUT_S) as users_router:  # a router the launch names
        args.sglang_router_ip, args.sglang_router_port = users_router.ip, users_router.port
        placement = Placement(None, [])
        started = routing.start_engine_servers(args, placement)
        assert started == ([], None) and placement.stoppers == []  # nothing of its own to stop
        routing.route_engines(args, placement, manager, ([worker.url], None))
        placement.stoppers[0]()
        assert (args.sglang_router_ip, args.sglang_router_port) == (users_router.ip, users_router.port)
        assert httpx.get(f"{users_router.url}/workers", timeout=5).json()["workers"] == []  # removed at the end


def test_a_router_address_needs_both_its_ip_and_its_port():
    with pytest.raises(MilesConfigError, match="--sglang-router-ip is given alone"):
        parse_args(argv=["--sglang-router-ip", "127.0.0.1"])
    with pytest.raises(MilesConfigError, match="--sglang-router-port is given alone"):
        parse_args(argv=["--sglang-router-port", "30000"])


@pytest.mark.parametrize(("argv", "serves"), [
    ([], False),  # miles' own rollouts call the engines' actors: no fronts, no router
    (["--custom-generate-function-path", "examples.custom_generate.single_turn_http.generate"], True),
    (["--sglang-router-ip", "127.0.0.1", "--sglang-router-port", "30000"], True),
    (["--sglang-router-policy", "round_robin"], True),
    (["--router-health-check-interval-secs", "5"], True),
    (["--rollout-backend", "sglang"], True),
])
def test_a_run_serves_http_when_something_in_it_talks_http(argv, serves, monkeypatch):
    from miles.ray.routing import serves_http

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3]))  # the examples, as a launch names them
    assert serves_http(parse_args(argv=argv)) is serves
