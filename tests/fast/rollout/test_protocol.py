"""Both rollout engines implement the one engine protocol (miles/rollout/protocol.py), and --rollout-backend picks
the engine in one place."""

import inspect

import pytest

from miles.config.flags import ROLLOUT_BACKENDS
from miles.rollout.engine import TorchRolloutEngine
from miles.rollout.engine_actor import engine_actor_class
from miles.rollout.protocol import ENGINE_VERBS, ENGINES, RolloutEngine, engine_class
from miles.rollout.sglang_engine import SGLangRolloutEngine

ENGINE_CLASSES = {"torch": TorchRolloutEngine, "sglang": SGLangRolloutEngine}
PROTOCOL_METHODS = ("preflight", "check_prompt_capacity", "init_args", "ready", "load_pushed", "push_perf", "generate")  # written out


def test_each_rollout_backend_has_its_engine():
    assert set(ENGINES) == set(ROLLOUT_BACKENDS)
    for backend, expected in ENGINE_CLASSES.items():
        assert engine_class(backend) is expected


def _parameters(function) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name not in ("self", "cls")]


@pytest.mark.parametrize("backend", sorted(ENGINE_CLASSES))
def test_the_engine_implements_every_member_of_the_protocol_with_its_signature(backend):
    engine = ENGINE_CLASSES[backend]
    for name in PROTOCOL_METHODS:
        protocol_member, member = getattr(RolloutEngine, name), getattr(engine, name)
        assert callable(member), (backend, name)
        assert _parameters(member)[: len(_parameters(protocol_member))] == _parameters(protocol_member), (backend, name)
    assert isinstance(engine.waits_for_start, bool)


def test_the_actor_shell_forwards_the_protocols_verbs():
    assert set(PROTOCOL_METHODS) - {"preflight", "check_prompt_capacity", "init_args"} <= set(ENGINE_VERBS)
    for engine in ENGINE_CLASSES.values():
        shell = engine_actor_class(engine)
        assert all(callable(getattr(shell, verb, None)) for verb in ("ready", "load_pushed", "push_perf", "generate"))
    assert callable(getattr(engine_actor_class(SGLangRolloutEngine), "shutdown", None))  # its own processes
    assert not hasattr(engine_actor_class(TorchRolloutEngine), "shutdown")


def test_only_the_slow_engine_is_waited_for():
    assert SGLangRolloutEngine.waits_for_start and not TorchRolloutEngine.waits_for_start
