"""Configuration for every test: what the ``megatron`` marker does (pyproject.toml declares it)."""

import pytest

from tests.extras import MEGATRON_ABSENT, megatron_installed


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``megatron``, with the reason, only when the [megatron] extra is not installed. With
    it installed they run, and an import of megatron-core that breaks fails them."""
    if megatron_installed():
        return
    skip = pytest.mark.skip(reason=MEGATRON_ABSENT)
    for item in items:
        if item.get_closest_marker("megatron") is not None:
            item.add_marker(skip)
