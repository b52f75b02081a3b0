"""Shared fixtures: one embedded default built into a temporary cache for the whole session, and one engine.

Tests that change an engine's weights make their own engine; the shared one keeps the built checkpoint.
"""

import pytest

from miles.rollout.embedded import EmbeddedPaths, ensure_embedded_default
from miles.rollout.engine import TorchRolloutEngine


@pytest.fixture(scope="session")
def embedded(tmp_path_factory) -> EmbeddedPaths:
    return ensure_embedded_default(str(tmp_path_factory.mktemp("miles-cache")))


@pytest.fixture(scope="session")
def engine(embedded) -> TorchRolloutEngine:
    return TorchRolloutEngine(embedded.checkpoint_dir, seed=0)
