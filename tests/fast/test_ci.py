"""CI runs the README's test command, and that command runs the fast tests before the end-to-end ones."""

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _readme_test_command() -> str:
    readme = (REPO_ROOT / "README.md").read_text()
    block = re.search(r"Run the tests .*?```bash\n(.*?)\n```", readme, re.DOTALL)
    assert block, "README.md has no 'Run the tests' command block"
    return block.group(1).strip()


def test_ci_runs_the_readmes_test_command():
    ci_lines = [line.strip() for line in (REPO_ROOT / ".ci" / "run").read_text().splitlines()]
    assert _readme_test_command() in ci_lines


def test_the_fast_tests_run_first_and_stop_the_end_to_end_tests_on_failure():
    steps = _readme_test_command().split(" && ")
    assert steps == ["bash scripts/setup.sh --with-sglang", ".venv/bin/python -m pytest tests/fast",
                     ".venv/bin/python -m pytest tests/e2e"]
