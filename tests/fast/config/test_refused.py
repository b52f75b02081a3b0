"""Refused upstream flags: parsed with upstream's arity, named all at once in one error line, exit 2, and the
values a row accepts change nothing."""

import subprocess
import sys
from pathlib import Path

import pytest

from miles.config.arguments import build_parser, parse_args
from miles.config.departures import (
    GROUPS_BEGIN,
    GROUPS_END,
    REFUSED_BEGIN,
    REFUSED_END,
    load_refusals,
    refused_groups,
    refused_markdown,
    render_into,
)
from miles.config.refused import implemented_actions, refusal_line
from miles.conformance.render import groups_markdown

REPO = Path(__file__).resolve().parents[3]


def _parse(words):
    return build_parser().parse_args(words)


def test_every_row_has_a_reason_and_its_accepted_values_belong_to_its_flags():
    groups = refused_groups()
    assert len(load_refusals()) > 800 and groups  # a sanity bound: rows move out as miles implements them
    for group, row in groups.items():
        flags = {*row.get("switches", ()), *row.get("values", ()), *row.get("nargs", {})}
        assert row["why"] and flags, group
        assert set(row.get("accepts", {})) <= flags, group


def test_no_refused_flag_is_one_miles_implements():
    implemented = {option for action in implemented_actions(build_parser()) for option in action.option_strings}
    assert not implemented & set(load_refusals())


def test_one_line_names_every_refused_flag_of_the_launch_grouped_by_reason():
    namespace = _parse(["--use-opd", "--lr", "1e-4", "--bf16", "--context-parallel-size", "2",
                        "--recompute-activations", "--lora-rank", "8"])
    line = refusal_line(namespace)
    assert "\n" not in line and not hasattr(namespace, "refused_flags") and namespace.lr == 1e-4
    # each group's flags together, then its reason and what it accepts, the groups in the launch's order
    assert "--use-opd: refused by decision: on-policy distillation needs a second" in line
    assert "; --context-parallel-size 2: miles' megatron backend has tensor parallelism" in line
    assert "(accepted: --context-parallel-size 1)" in line
    for shown in ("--bf16", "--recompute-activations", "--lora-rank 8"):
        assert shown in line
    assert line.endswith("lists every refused flag and why).")


def test_accepted_values_compare_as_numbers_and_set_nothing():
    plain = vars(_parse([]))
    for words in (["--context-parallel-size", "1"], ["--expert-model-parallel-size", "1.0"],
                  ["--attention-softmax-in-fp32"]):
        namespace = _parse(words)
        assert refusal_line(namespace) is None and vars(namespace) == plain, words
    assert refusal_line(_parse(["--context-parallel-size", "2"])) is not None


def test_a_refused_flag_takes_the_words_upstreams_takes():
    # --rollout-stop-token-ids is issue 28's; --profile-ranks takes one or more values upstream (nargs "+")
    assert load_refusals()["--profile-ranks"].nargs == "+"
    namespace = _parse(["--profile-ranks", "0", "1", "2", "--lr", "1e-4"])
    assert "--profile-ranks 0 1 2:" in refusal_line(namespace) and namespace.lr == 1e-4


def test_the_driver_stops_with_exit_2_before_ray_in_one_error_line():
    result = subprocess.run([sys.executable, "train_async.py", "--use-opd", "--num-experts", "8",
                             "--use-tis", "--advantage-estimator", "ppo"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "unrecognized arguments" not in result.stderr
    assert "--use-opd:" in errors[0] and "--num-experts 8:" in errors[0]
    assert "Ray" not in result.stderr  # Ray's start-up lines never appear: the parser stopped first


DEFERRED_CASES = [
    [], ["--lr", "1e-4"], ["--use-opd", "--lr", "1e-4"], ["--lr", "abc", "--profile-ranks", "1", "2"],
    ["--profile-ranks", "1", "2", "--lr", "abc"], ["--context-parallel-size=1"], ["--context-parallel-size", "2"],
    ["--adv", "ppo"], ["--lr", "-1"], ["--no-such-flag", "3"], ["--train-backend", "fsdp"], ["--help"],
]


@pytest.mark.parametrize("words", DEFERRED_CASES, ids=" ".join)
def test_the_deferred_refused_flags_parse_as_the_full_parser_does(words, capsys):
    """``parse_args`` registers the refused flags only when the parse meets an option string it does not know; the
    namespace, or the error and exit status, is the one of the parser that has them all from the start."""
    outcomes = []
    for defer in (False, True):
        try:
            outcomes.append(vars(build_parser(defer_refused_flags=defer).parse_args(words)))
        except SystemExit as stopped:
            outcomes.append((stopped.code, capsys.readouterr()))
    assert outcomes[0] == outcomes[1]


def test_a_plugins_flag_replaces_the_refused_one_also_when_they_are_registered_late():
    parser = build_parser(lambda p: p.add_argument("--rlve", action="store_true"), defer_refused_flags=True)
    namespace = parser.parse_args(["--rlve", "--use-opd"])  # --use-opd registers the refused flags, after --rlve
    assert namespace.rlve is True and "--use-opd" in refusal_line(namespace)


def test_a_launch_without_a_refused_flag_never_reads_the_departures_table():
    code = ("import sys\nfrom miles.config.arguments import parse_args\n"
            "parse_args(argv=['--advantage-estimator', 'ppo', '--use-tis'])\n"
            "print('miles.config.departures' in sys.modules, 'tomllib' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.split() == ["False", "False"], result.stderr


def test_parse_args_refuses_before_validating():
    with pytest.raises(SystemExit) as stopped:
        parse_args(argv=["--expert-model-parallel-size", "8", "--lr", "-1"])  # --lr -1 would be a config error
    assert stopped.value.code == 2


def test_conformance_md_shows_the_refused_table_as_rendered_from_the_file():
    text = (REPO / "docs" / "conformance.md").read_text(encoding="utf-8")
    assert render_into(text, REFUSED_BEGIN, REFUSED_END, refused_markdown) == text, \
        "run: python -m miles.conformance.render"
    assert "| model parallelism (54) | `--allgather-cp`, `--hybrid-context-parallel`," in text
    assert "| routing replay (4) | `--use-routing-replay`, `--use-rollout-routing-replay`," in text


def test_conformance_md_shows_one_table_of_every_flag_group_as_rendered():
    text = (REPO / "docs" / "conformance.md").read_text(encoding="utf-8")
    assert render_into(text, GROUPS_BEGIN, GROUPS_END, groups_markdown) == text, \
        "run: python -m miles.conformance.render"
    table = groups_markdown().splitlines()[2:]
    # hand-counted from miles/config/flags.py: the four recompute flags, upstream's all
    assert "| activation recompute | implemented | 4 | 0 |" in text
    assert sum(row.split(" | ")[1] == "refused" for row in table) == len(refused_groups())
    refused_rows = {row.split(" | ")[0].lstrip("| "): int(row.split(" | ")[2]) for row in table if " | refused | " in row}
    assert sum(refused_rows.values()) == len(load_refusals())  # every refused flag in exactly one row
