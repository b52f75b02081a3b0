"""The one rule for SGLang tests: they run whenever the [sglang] extra is installed, and are skipped, with the
reason and the install command, only when it is not (never silently when it is)."""

from importlib.util import find_spec

import pytest

SGLANG_INSTALLED = find_spec("sglang") is not None
needs_sglang = pytest.mark.skipif(
    not SGLANG_INSTALLED,
    reason="the [sglang] extra is not installed: bash scripts/setup.sh --with-sglang (docs/sglang.md)",
)
