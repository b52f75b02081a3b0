"""The package layout is the architecture: sibling backends do not import each other, and the moved modules keep
their old entry points for one release (deprecated aliases)."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BACKENDS = REPO_ROOT / "miles" / "backends"
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.sh"))


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth of the file (function-level imports included)."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


@pytest.mark.parametrize(("backend", "sibling"), [
    ("megatron_backend", "miles.backends.torch_backend"),
    ("torch_backend", "miles.backends.megatron_backend"),
])
def test_a_backend_does_not_import_its_sibling(backend, sibling):
    files = sorted((BACKENDS / backend).rglob("*.py"))
    assert files, f"no modules under {backend}"
    offenders = {
        str(path.relative_to(REPO_ROOT)): sorted(m for m in imported_modules(path) if m.startswith(sibling))
        for path in files
    }
    assert {path: mods for path, mods in offenders.items() if mods} == {}


def test_the_import_scan_sees_a_function_level_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from miles.backends.torch_backend.models import HFTrainModel\n")
    assert "miles.backends.torch_backend.models" in imported_modules(module)


def _check(*command):
    result = subprocess.run([*command, *map(str, EXAMPLES)], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=120)
    return result.returncode, result.stdout


def test_the_checkers_entry_points_give_the_same_output_and_status():
    console_script = shutil.which("miles-check", path=str(Path(sys.executable).parent))
    assert console_script is not None, "the miles-check console script is not installed beside this Python"
    new = _check(sys.executable, "-m", "miles.check")
    assert new[0] == 0 and new[1].splitlines()[-1].endswith(f"{len(EXAMPLES)} OK")
    assert _check(console_script) == new
    assert _check(sys.executable, "-m", "miles.utils.check") == new  # the deprecated alias


def test_the_deprecated_module_paths_still_import_the_same_objects():
    import miles.check
    import miles.tracking.plot
    import miles.utils.check
    import miles.utils.plot

    assert miles.utils.check.check_launch is miles.check.check_launch
    assert miles.utils.check.main is miles.check.main
    assert miles.utils.plot.plot_run is miles.tracking.plot.plot_run
