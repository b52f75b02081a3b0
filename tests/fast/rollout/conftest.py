"""One engine on the session's embedded default (tests/fast/conftest.py), shared by the rollout tests, and its HTTP
front for the tests of the endpoint (one per test module, stopped after it).

Tests that change an engine's weights make their own engine; the shared one keeps the built checkpoint.
"""

import threading

import pytest

from miles.rollout.engine import TorchRolloutEngine
from miles.rollout.engine_server import EngineServer


@pytest.fixture(scope="session")
def engine(embedded) -> TorchRolloutEngine:
    return TorchRolloutEngine(embedded.checkpoint_dir, seed=0)


@pytest.fixture(scope="module")
def server(engine):
    served = EngineServer(engine, threading.Lock(), "torch rollout engine", "truncated")
    served.start()
    yield served
    served.stop()
