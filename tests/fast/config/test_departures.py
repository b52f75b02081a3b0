"""The departures table: well formed, and the docs and --help say what it says."""

from pathlib import Path

import pytest

from miles.config.departures import (
    DOCS_BEGIN,
    DOCS_END,
    help_lines,
    load_additions,
    load_departures,
    markdown,
    render_into,
)
from miles.utils.arguments import build_parser

TRAINING_MD = Path(__file__).resolve().parents[3] / "docs" / "training.md"
FIELDS = {"dest", "default", "type", "choices", "action", "nargs", "required", "meaning"}


def test_every_departure_names_real_fields_its_two_sides_and_a_reason():
    departures = load_departures()
    assert departures  # the file is read, not silently empty
    for flag, departure in departures.items():
        assert flag.startswith("--") and departure.differs and set(departure.differs) <= FIELDS, flag
        assert departure.miles is not None and departure.upstream is not None and departure.why, flag
    for flag, addition in load_additions().items():
        assert flag.startswith("--") and addition.why, flag


def test_every_listed_flag_is_one_of_miles_flags():
    options = {option for action in build_parser()._actions for option in action.option_strings}
    additions = load_additions()
    listed = set(load_departures()) | {o for flag, a in additions.items() for o in (flag, *a.aliases)}
    assert listed <= options, listed - options


def test_training_md_shows_the_table_as_rendered_from_the_file():
    text = TRAINING_MD.read_text(encoding="utf-8")
    assert render_into(text) == text, "run: python -m miles.conformance.render"
    assert "| `--lr` | default | 0.0003 | 1e-06 |" in markdown()


def test_help_ends_with_every_departure_and_every_added_flag():
    epilog = build_parser().epilog
    assert epilog.endswith("\n".join(help_lines()))
    for flag in (*load_departures(), *load_additions()):
        assert f"  {flag}" in epilog, flag


def test_a_document_without_the_section_is_refused():
    with pytest.raises(ValueError, match="has no"):
        render_into(f"# doc\n{DOCS_BEGIN}\nno end marker\n")
    assert DOCS_END in render_into(f"{DOCS_BEGIN}\nold\n{DOCS_END}\ntail").split("\n")[-2]
