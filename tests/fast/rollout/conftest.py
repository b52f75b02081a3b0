"""One engine for the rollout tests (the embedded default it loads is built by tests/fast/conftest.py).

Tests that change an engine's weights make their own engine; the shared one keeps the built checkpoint.
"""

import pytest

from miles.rollout.engine import TorchRolloutEngine


@pytest.fixture(scope="session")
def engine(embedded) -> TorchRolloutEngine:
    return TorchRolloutEngine(embedded.checkpoint_dir, seed=0)
