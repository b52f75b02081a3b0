"""Comments cite the design by section (docs/design.md §N): every cited section exists, and no file cites a design
file the repository does not have."""

import re
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DESIGN = REPO_ROOT / "docs" / "design.md"
CITATION = re.compile(r"docs/design\.md\s+((?:§\d+(?:,\s*)?)+)")


def _tracked_text_files() -> dict[str, str]:
    names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    texts = {}
    for name in names:
        path = REPO_ROOT / name
        if path.suffix in (".py", ".md", ".toml", ".sh", ".txt", ".cfg") and path.is_file():
            texts[name] = path.read_text(errors="replace")
    return texts


def _sections() -> set[int]:
    return {int(number) for number in re.findall(r"^## (\d+)\. ", DESIGN.read_text(), flags=re.MULTILINE)}


def test_every_cited_section_of_the_design_exists():
    sections = _sections()
    assert sections == set(range(1, max(sections) + 1))
    cited = {(name, int(number)) for name, text in _tracked_text_files().items()
             for match in CITATION.finditer(text) for number in re.findall(r"\d+", match.group(1))}
    assert cited, "nothing cites the design"
    assert sorted((name, number) for name, number in cited if number not in sections) == []


def test_no_file_cites_a_design_file_that_is_not_in_the_repository():
    texts = _tracked_text_files()
    present = {Path(name).name for name in texts}
    # the names are assembled so that this file does not cite them itself
    for cited_name in ("DESIGN" + ".md", "STYLE" + ".md"):
        if cited_name not in present:
            assert sorted(name for name, text in texts.items() if cited_name in text) == [], cited_name
