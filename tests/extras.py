"""Which optional extras this test run has, decided by the installed distribution and never by an import: with
the extra installed, a broken import (a new torch or transformers) must fail its tests, not skip them."""

import importlib.metadata

MEGATRON_DISTRIBUTION = "megatron-core"
MEGATRON_ABSENT = ("needs the [megatron] extra, which is not installed (no megatron-core distribution): "
                   "pip install -e '.[megatron]' to run it")


def megatron_installed() -> bool:
    """True when the megatron-core distribution is installed, whether or not ``megatron.core`` imports."""
    try:
        importlib.metadata.distribution(MEGATRON_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True

