"""The checker's entry points (the console script and ``python -m miles.check``) agree; which package may import
which is tests/fast/test_layers.py."""

import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.sh"))


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

