"""Shared fixture: one embedded default built into a temporary cache for the whole session."""

import pytest

from miles.rollout.embedded import EmbeddedPaths, ensure_embedded_default


@pytest.fixture(scope="session")
def embedded(tmp_path_factory) -> EmbeddedPaths:
    return ensure_embedded_default(str(tmp_path_factory.mktemp("miles-cache")))
