"""The rollout engines' Ray actor class: a shell that imports nothing heavy around the real engine, and serves it
over HTTP.

Ray deserializes an actor handle by loading the actor's class in the receiving process (to learn its methods). The
RolloutManager receives every engine's handle, so with the engine class itself as the actor class, the manager's
process imported torch and transformers (and SGLang) at every run's start: measured 2.2 s of a 2-core machine's
time per run, for a process that only dispatches. ``engine_actor_class(engine_class)`` gives a class named after the
engine, with the engine's verbs as methods (Ray's timeline and errors still say ``TorchRolloutEngine.generate``);
the engine class travels as a constructor argument, so only the engine's own process unpickles it (a subclass a test
defines included).

The shell also runs the engine's HTTP server (``start_server``: SGLang's API, ``miles.rollout.engine_server``) and
holds the one lock that every verb and every served request takes: a weight push never lands inside a generation.
"""

from __future__ import annotations

import threading

from miles.rollout.protocol import ENGINE_VERBS


class EngineActor:
    """One rollout engine's process: builds ``engine_class(*init_args)`` and answers its verbs."""

    def __init__(self, engine_class, *init_args) -> None:
        self.engine = engine_class(*init_args)
        self.lock = threading.Lock()
        self.server = None

    def start_server(self, logprobs: str, host: str = "127.0.0.1") -> str:
        """Serve the engine over HTTP (``logprobs``: the run's --sampling-logprobs); returns the server's URL."""
        from miles.rollout.engine_server import EngineServer

        if self.server is None:
            self.server = EngineServer(self.engine, self.lock, getattr(self.engine, "name", "rollout engine"),
                                       logprobs, host)
            self.server.start()
        return self.server.url

    def take_witnessed(self) -> dict:
        """The answers the server gave since the last call (``EngineServer.take_witnessed``)."""
        return self.server.take_witnessed() if self.server is not None else {}

    def stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def _forward(verb: str):
    def method(self, *args, **kwargs):
        if verb == "shutdown":
            self.stop_server()
        with self.lock:
            return getattr(self.engine, verb)(*args, **kwargs)

    method.__name__ = method.__qualname__ = verb
    return method


def engine_actor_class(engine_class) -> type:
    """An ``EngineActor`` named after ``engine_class``, with a method for each verb ``engine_class`` has (so
    ``hasattr(handle, "shutdown")`` still tells an engine with processes of its own)."""
    verbs = [verb for verb in ENGINE_VERBS if callable(getattr(engine_class, verb, None))]
    return type(engine_class.__name__, (EngineActor,), {verb: _forward(verb) for verb in verbs})
