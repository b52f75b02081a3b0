"""The rollout engines' Ray actor class: a shell that imports nothing heavy around the real engine.

Ray deserializes an actor handle by loading the actor's class in the receiving process (to learn its methods). The
RolloutManager receives every engine's handle, so with the engine class itself as the actor class, the manager's
process imported torch and transformers (and SGLang) at every run's start: measured 2.2 s of a 2-core machine's
time per run, for a process that only dispatches. ``engine_actor_class(engine_class)`` gives a class named after the
engine, with the engine's verbs as methods (Ray's timeline and errors still say ``TorchRolloutEngine.generate``);
the engine class travels as a constructor argument, so only the engine's own process unpickles it (a subclass a test
defines included).
"""

from __future__ import annotations

from miles.rollout.protocol import ENGINE_VERBS


class EngineActor:
    """One rollout engine's process: builds ``engine_class(*init_args)`` and answers its verbs."""

    def __init__(self, engine_class, *init_args) -> None:
        self.engine = engine_class(*init_args)


def _forward(verb: str):
    def method(self, *args, **kwargs):
        return getattr(self.engine, verb)(*args, **kwargs)

    method.__name__ = method.__qualname__ = verb
    return method


def engine_actor_class(engine_class) -> type:
    """An ``EngineActor`` named after ``engine_class``, with a method for each verb ``engine_class`` has (so
    ``hasattr(handle, "shutdown")`` still tells an engine with processes of its own)."""
    verbs = [verb for verb in ENGINE_VERBS if callable(getattr(engine_class, verb, None))]
    return type(engine_class.__name__, (EngineActor,), {verb: _forward(verb) for verb in verbs})
