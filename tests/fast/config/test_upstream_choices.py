"""A value upstream's parser accepts and miles' does not (``--train-backend fsdp`` from an upstream launcher) is
argparse's invalid-choice error plus the departure's reason; any other bad value is argparse's error alone."""

from pathlib import Path

import pytest

from miles.config.arguments import build_parser

DOCS_ANCHOR = "docs/training.md#departures-from-upstream"


def _error_line(capsys, words) -> str:
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(words)
    assert stop.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("flag, value, reason", [
    ("--train-backend", "fsdp", "upstream's FSDP backend is experimental there and not provided"),
    ("--advantage-estimator", "on_policy_distillation", "needs a teacher model served next to the policy"),
    ("--optimizer", "muon", "Muon is not implemented"),
    ("--optimizer", "dist_muon", "Muon is not implemented"),
])
def test_an_upstream_only_choice_says_why_miles_departs(capsys, flag, value, reason):
    line = _error_line(capsys, [flag, value])
    assert f"argument {flag}: invalid choice: '{value}' (choose from " in line
    assert f"upstream's parser accepts '{value}', miles does not: " in line
    assert reason in line and line.endswith(f"({DOCS_ANCHOR})")


@pytest.mark.parametrize("flag, value", [("--train-backend", "fdsp"), ("--optimizer", "adamw"),
                                         ("--advantage-estimator", "distillation")])
def test_a_value_neither_parser_accepts_is_argparses_error_alone(capsys, flag, value):
    line = _error_line(capsys, [flag, value])
    assert line.endswith(f"argument {flag}: invalid choice: '{value}' (choose from "
                         + ", ".join(repr(choice) for choice in build_parser()._option_string_actions[flag].choices)
                         + ")")


def test_the_reason_links_to_a_section_that_exists():
    training = (Path(__file__).resolve().parents[3] / "docs" / "training.md").read_text()
    assert "\n## Departures from upstream\n" in training
