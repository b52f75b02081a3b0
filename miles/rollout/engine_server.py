"""SGLang's HTTP API in front of one rollout engine, in the engine's own process (docs/rollout.md).

The router (``miles.rollout.router``) sends every generate function's request here. The server runs uvicorn on a
thread of the engine's Ray actor, on a socket bound to 127.0.0.1 and a free port, and answers ``/generate`` (``miles.rollout.endpoint``) and what the router and a health check call:
``/health``, ``/health_generate``, ``/get_model_info``, ``/get_server_info``, ``/flush_cache``, ``/abort_request``
and ``/get_weight_version``.

Requests are batched: one thread takes every request waiting for the engine, groups those that sample alike
(temperature, length, top-p/k, min-p, stops) and generates each group in one engine call, each row with its own
seed (the request's ``sampling_seed``, else the server's next one). A generate function awaits its samples' requests
together, so they reach the engine as one batch, as miles' own rollouts do; which requests share a batch changes only
the last bits of their log-probs (float rounding of the padded batch), and the records keep what was served.

One weight version per answer: the actor shell holds one lock around every engine verb and every batch served here,
so a push never lands inside a request (``miles.rollout.engine_actor``).

The server is the witness: every answer is recorded by its context (the request's tokens) with the tokens generated
after it, their log-probs, the weight versions and the fingerprint of the weights that produced them, and the kept
ids of truncated sampling. The rollout manager takes the records after a custom generation and checks each returned
sample against them, turn by turn (``miles.rollout.custom_generate``): what a generate function says an engine
generated must be what an engine served, after exactly the tokens before it.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from miles.rollout.endpoint import EndpointError, GenerateRequest, generate_answer, parse_generate, trimmed_text
from miles.utils.errors import MilesConfigError, RolloutEngineError

MAX_WITNESSED = 200_000  # contexts whose answers are kept until the manager takes them; the oldest go first
START_TIMEOUT_S = 30.0
MAX_BATCH_REQUESTS = 256  # requests taken into one round of batches


@dataclass(frozen=True)
class Served:
    """What an engine served after one context: the tokens it generated and the facts a trained sample must carry
    about them."""

    tokens: tuple[int, ...]
    log_probs: list[float]
    weight_versions: list[int]
    weight_fingerprint: str | None
    kept_ids: list[list[int]] | None


@dataclass(eq=False)  # each request is itself: compared by identity
class Pending:
    """A request waiting for the engine, and where its answers go (on the server's event loop)."""

    request: GenerateRequest
    number: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop

    @property
    def group(self) -> tuple:
        """Requests of one group sample alike and are generated in one engine call."""
        r = self.request
        return (r.temperature, r.max_new_tokens, repr(sorted(r.sampling.items())))

    def resolve(self, outcome) -> None:
        def set_outcome():
            if not self.future.done():
                (self.future.set_exception if isinstance(outcome, BaseException) else self.future.set_result)(outcome)

        self.loop.call_soon_threadsafe(set_outcome)


class EngineServer:
    """The HTTP front of ``engine`` (``lock`` serializes it with the actor's verbs); ``url`` once started."""

    def __init__(self, engine, lock: threading.Lock, name: str, logprobs: str, host: str = "127.0.0.1") -> None:
        self.engine, self.lock, self.name, self.logprobs = engine, lock, name, logprobs
        # context (the request's tokens) -> every answer generated after exactly that context (the samples of one
        # prompt, or repeats with log-probs that differ in the last bits when the engine batched them differently)
        self.witnessed: OrderedDict[tuple[int, ...], list[Served]] = OrderedDict()
        self.witness_lock = threading.Lock()
        self.seeds = itertools.count()  # a request without sampling_seed takes the engine's next one
        self.aborted_before = 0  # requests numbered below this were aborted while they waited
        self.requests = itertools.count(1)
        self.waiting: queue.Queue[Pending] = queue.Queue()
        self.stopping = threading.Event()
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, 0))
        self.url = f"http://{host}:{self.socket.getsockname()[1]}"
        self.server = None
        self.thread = None
        self.batcher = threading.Thread(target=self._batch_forever, name="miles-engine-batcher", daemon=True)

    def start(self) -> str:
        """Serve on a daemon thread; returns the URL once uvicorn listens (a failure is one line)."""
        import uvicorn

        # "error": sglang-router's two HTTP/2 probes of each worker would log "Invalid HTTP request" warnings
        config = uvicorn.Config(self._app(), log_level="error", access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                       name="miles-engine-server", daemon=True)
        self.thread.start()
        self.batcher.start()
        for _ in range(int(START_TIMEOUT_S / 0.05)):
            if self.server.started:
                return self.url
            if not self.thread.is_alive():
                break
            time.sleep(0.05)
        raise RolloutEngineError(f"{self.name}: its HTTP server did not start on {self.url} within "
                                 f"{START_TIMEOUT_S:g} s")

    def stop(self) -> None:
        self.stopping.set()
        if self.server is not None:
            self.server.should_exit = True
            self.thread.join(timeout=10)
        if self.batcher.is_alive():
            self.batcher.join(timeout=10)
        self.socket.close()

    def take_witnessed(self) -> dict[tuple[int, ...], list[Served]]:
        """Every answer recorded since the last call (and forget them)."""
        with self.witness_lock:
            taken, self.witnessed = dict(self.witnessed), OrderedDict()
        return taken

    def _app(self):
        app = FastAPI()
        info = {"model_path": self.engine.model_path, "tokenizer_path": self.engine.model_path,
                "is_generation": True, "served_model_name": self.engine.model_path}

        @app.post("/generate")
        async def generate(request: Request):
            number = next(self.requests)
            try:
                parsed = parse_generate(await request.json())
                pending = Pending(parsed, number, asyncio.get_running_loop().create_future(),
                                  asyncio.get_running_loop())
                self.waiting.put(pending)
                answers = await pending.future
            except (EndpointError, MilesConfigError) as error:  # the request's fault: not retried
                return JSONResponse({"error": {"message": str(error)}}, status_code=400)
            except Exception as error:  # noqa: BLE001 - the engine's (a divergence): its message, not a bare 500
                return JSONResponse({"error": {"message": f"{self.name}: {type(error).__name__}: {error}"}},
                                    status_code=500)
            return answers if parsed.batched else answers[0]

        @app.get("/health")
        @app.get("/health_generate")
        async def health():
            return {}

        @app.get("/get_model_info")
        @app.get("/model_info")
        async def model_info():
            return {**info, "weight_version": str(self.engine.weight_version)}

        @app.get("/get_server_info")
        @app.get("/server_info")
        async def server_info():
            return {**info, "engine": self.name, "weight_version": str(self.engine.weight_version)}

        @app.get("/get_weight_version")
        async def weight_version():
            return {"weight_version": str(self.engine.weight_version)}

        @app.api_route("/flush_cache", methods=["GET", "POST"])
        async def flush_cache():
            return {}  # miles' engines keep no cache between requests

        @app.post("/abort_request")
        async def abort_request(request: Request):
            self.aborted_before = next(self.requests)  # every request that waits for the engine now is aborted
            return {}

        return app

    def _batch_forever(self) -> None:
        """Take every waiting request, and serve each group of alike ones in one engine call, until stopped."""
        while not self.stopping.is_set():
            try:
                pending = [self.waiting.get(timeout=0.1)]
            except queue.Empty:
                continue
            while len(pending) < MAX_BATCH_REQUESTS:
                try:
                    pending.append(self.waiting.get_nowait())
                except queue.Empty:
                    break
            groups: dict[tuple, list[Pending]] = {}
            for one in pending:
                groups.setdefault(one.group, []).append(one)
            for group in groups.values():
                self._serve_group(group)

    def _serve_group(self, group: list[Pending]) -> None:
        """One engine call for the group; if it fails and holds several requests, each alone (so one bad request,
        a prompt too long for the model, fails only itself)."""
        try:
            answers = self._generate(group)
        except Exception as error:  # noqa: BLE001 - handed to the request(s), answered 400 or 500
            if len(group) == 1:
                group[0].resolve(error)
                return
            for one in group:
                self._serve_group([one])
            return
        for one, answer in zip(group, answers, strict=True):
            one.resolve(answer)

    def _generate(self, group: list[Pending]) -> list[list[dict]]:
        """The answers of each request of a group (module docstring), recorded as witnessed."""
        first = group[0].request
        with self.lock:
            rows_of = [one.request.rows if one.request.rows is not None
                       else self.engine.encode_texts(one.request.texts, first.max_new_tokens) for one in group]
            served = [one for one, _ in zip(group, rows_of, strict=True) if one.number >= self.aborted_before]
            rows = [row for one, own in zip(group, rows_of, strict=True) if one in served for row in own]
            seeds = [one.request.seed if one.request.seed is not None else next(self.seeds)
                     for one, own in zip(group, rows_of, strict=True) if one in served for _ in own]
            generated, versions = self.engine.generate_rows(
                rows, 1, first.temperature, first.max_new_tokens, 0, {**first.sampling, "logprobs": self.logprobs},
                row_seeds=seeds) if rows else ([], [])
            fingerprint, held = self.engine.weight_fingerprint, self.engine.weight_version
        outputs = iter(zip(generated, versions, strict=True))
        return [self._answers(one.request, own, outputs, fingerprint) if one in served
                else [generate_answer(rid, len(row), [], [], False, held, "", one.request.return_logprob,
                                      aborted=True) for rid, row in zip(one.request.rids, own, strict=True)]
                for one, own in zip(group, rows_of, strict=True)]

    def _answers(self, request: GenerateRequest, rows: list[list[int]], outputs, fingerprint: str | None) -> list[dict]:
        answers = []
        for rid, row in zip(request.rids, rows, strict=True):
            out, versions = next(outputs)
            with self.witness_lock:
                self.witnessed.setdefault(tuple(row), []).append(
                    Served(tuple(out.tokens), out.log_probs, versions, fingerprint, out.kept_ids))
                while len(self.witnessed) > MAX_WITNESSED:
                    self.witnessed.popitem(last=False)
            text = self.engine.tokenizer.decode(out.tokens, skip_special_tokens=request.skip_special_tokens)
            answers.append(generate_answer(rid, len(row), out.tokens, out.log_probs, out.stopped, versions[-1],
                                           trimmed_text(text, request.sampling["stop"], out.stopped,
                                                        request.no_stop_trim), request.return_logprob))
        return answers
