"""The megatron tests are skipped, with the reason, only when the [megatron] extra is not installed: with
megatron-core installed but its import broken they fail. Each case runs pytest on a megatron test file in a
subprocess, with a shadow on PYTHONPATH that breaks the import or hides the distribution."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.extras import MEGATRON_ABSENT, MEGATRON_DISTRIBUTION, megatron_installed

REPO_ROOT = Path(__file__).resolve().parents[2]
# One module that imports megatron-core at its top, one test that imports it only when it builds a model.
MODULE_LEVEL = "tests/fast/megatron/test_cpu_shim.py"
MARKED_TEST = ("tests/fast/megatron/test_megatron_model.py::"
               "test_the_pushed_weights_are_the_hf_weights_and_fingerprint_identically[embedded]")
# Hides the distribution from importlib.metadata, as an environment without the extra (the package itself stays
# importable: the skip must depend on the distribution alone).
HIDE_DISTRIBUTION = f"""
import importlib.metadata as metadata
_distribution = metadata.distribution
def _without_megatron(name):
    if name == {MEGATRON_DISTRIBUTION!r}:
        raise metadata.PackageNotFoundError(name)
    return _distribution(name)
metadata.distribution = _without_megatron
"""


def _pytest(shadow: Path, *arguments: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), str(REPO_ROOT)])}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", *arguments],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not megatron_installed(), reason=MEGATRON_ABSENT)
def test_an_installed_megatron_core_whose_import_breaks_fails_the_megatron_tests(tmp_path):
    package = tmp_path / "megatron" / "core"
    package.mkdir(parents=True)
    (tmp_path / "megatron" / "__init__.py").write_text("")
    # As when a module of megatron-core is renamed under it (the error pytest.importorskip would skip on).
    (package / "__init__.py").write_text(
        'raise ModuleNotFoundError("simulated: megatron.core.renamed is gone", name="megatron.core.renamed")\n')
    result = _pytest(tmp_path, "--continue-on-collection-errors", MODULE_LEVEL, MARKED_TEST)
    output = result.stdout + result.stderr
    assert result.returncode not in (0, 5), output
    assert "simulated: megatron.core.renamed is gone" in output
    assert "skipped" not in output.lower(), output
    assert "1 failed, 1 error" in output, output  # the marked test, and the module that imports it at its top


def test_without_the_extra_the_megatron_tests_are_skipped_with_the_reason(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(HIDE_DISTRIBUTION)
    result = _pytest(tmp_path, MODULE_LEVEL, MARKED_TEST)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "2 skipped" in output, output
    assert f"test_cpu_shim.py:10: {MEGATRON_ABSENT}" in output, output  # the module, skipped before its imports
    assert f"test_megatron_model.py: {MEGATRON_ABSENT}" in output, output
