"""Fixtures shared by the fast tests: one embedded default built into a temporary cache for the whole session, and
one tiny random Qwen3 (tests/tiny_qwen3.py)."""

import sys

import pytest
import torch

from miles.rollout.embedded import EmbeddedPaths, ensure_embedded_default
from tests.tiny_qwen3 import save_tiny_qwen3


@pytest.fixture(scope="session")
def embedded(tmp_path_factory) -> EmbeddedPaths:
    return ensure_embedded_default(str(tmp_path_factory.mktemp("miles-cache")))


@pytest.fixture(scope="session")
def qwen3_checkpoint(tmp_path_factory, embedded) -> str:
    return save_tiny_qwen3(tmp_path_factory.mktemp("qwen3"), embedded.checkpoint_dir)


@pytest.fixture
def importable_module(tmp_path, monkeypatch):
    """``write(name, text) -> name``: a module of that source, importable as ``name`` for one test (a plug-in, a
    reward or TIS function named by a dotted path) and forgotten after it, passed or failed."""
    written = []

    def write(name: str, text: str) -> str:
        (tmp_path / f"{name}.py").write_text(text)
        monkeypatch.syspath_prepend(str(tmp_path))
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


@pytest.fixture
def restore_torch_threads():
    """A train process pins this process's torch threads; give the other tests theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="session")
def _single_process_parallel_state():
    """A test process is one rank: the layout a train process sets for itself (miles.backends.training_utils.parallel)."""
    from miles.backends.training_utils.parallel import set_parallel_state, single_process_state

    set_parallel_state(single_process_state())
