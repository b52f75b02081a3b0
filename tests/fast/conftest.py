"""Fixtures shared by the fast tests: one embedded default built into a temporary cache for the whole session."""

import pytest
import torch

from miles.rollout.embedded import EmbeddedPaths, ensure_embedded_default


@pytest.fixture(scope="session")
def embedded(tmp_path_factory) -> EmbeddedPaths:
    return ensure_embedded_default(str(tmp_path_factory.mktemp("miles-cache")))


@pytest.fixture
def restore_torch_threads():
    """A train process pins this process's torch threads; give the other tests theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
