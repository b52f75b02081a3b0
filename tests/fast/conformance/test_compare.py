"""compare: differences between two parsers' records, and the departures table's bookkeeping, on hand-made records."""

from miles.config.departures import Departure
from miles.conformance.compare import (
    Difference,
    flag_differences,
    only_in_miles,
    refusal_mismatches,
    stale_listings,
    undocumented,
    value_disagreement,
    wrong_default_listings,
)


def _record(dest, **fields):
    return {"dest": dest, "type": "str", "choices": None, "action": "store", "nargs": None, "required": False,
            **fields}


MILES = {"--lr": _record("lr", type="float"), "--style": _record("style", choices=["a", "b"]),
         "--norm": _record("norm", action="store_true", type=None, nargs=0), "--ours": _record("ours")}
UPSTREAM = {"--lr": _record("lr", type="float"), "--style": _record("style", choices=["a", "b", "c"]),
            "--norm": _record("grpo_norm", action="store_false", type=None, nargs=0), "--theirs": _record("theirs")}


def test_every_field_a_shared_flag_differs_in_is_found_and_only_shared_flags_are_compared():
    miles_defaults = {"lr": 3e-4, "style": "a", "norm": False}
    upstream_defaults = {"lr": 1e-6, "style": "a", "grpo_norm": True}
    found = {(d.flag, d.field) for d in flag_differences(MILES, UPSTREAM, miles_defaults, upstream_defaults)}
    assert found == {("--lr", "default"), ("--style", "choices"), ("--norm", "dest"), ("--norm", "action"),
                     ("--norm", "default")}
    assert only_in_miles(MILES, UPSTREAM) == ["--ours"]


def test_a_difference_not_listed_is_undocumented_and_a_listing_with_no_difference_is_stale():
    differences = [Difference("--lr", "default", 3e-4, 1e-6), Difference("--style", "choices", ["a"], ["a", "c"])]
    departures = {"--lr": Departure(differs=("default",), miles=3e-4, upstream=1e-6, why="w"),
                  "--norm": Departure(differs=("action",), why="w"),
                  "--max": Departure(differs=("meaning",), why="never stale: no parser shows it")}
    assert undocumented(differences, departures) == [differences[1]]
    assert stale_listings(differences, departures) == ["--norm: action"]


def test_a_listed_default_must_be_the_parsers_value():
    differences = [Difference("--lr", "default", 3e-4, 1e-6), Difference("--key", "default", "prompt", None),
                   Difference("--tb", "default", True, False)]
    right = {"--lr": Departure(differs=("default",), miles=0.0003, upstream=1e-6),
             "--key": Departure(differs=("default",), miles="prompt", upstream="none"),
             "--tb": Departure(differs=("default",), miles=True, upstream=False)}
    assert wrong_default_listings(differences, right) == []
    wrong = {"--lr": Departure(differs=("default",), miles=1e-4, upstream=1e-6),
             "--key": Departure(differs=("default",), miles="prompt", upstream="input"),
             "--tb": Departure(differs=("default",), miles=1, upstream=False)}  # 1 is not True here
    assert len(wrong_default_listings(differences, wrong)) == 3


def test_values_of_one_command_line_are_compared_through_each_sides_dest():
    ours, theirs = {"lr": 0.25, "norm": True}, {"lr": 0.25, "grpo_norm": False}
    assert value_disagreement("--lr", MILES, UPSTREAM, ours, theirs) is None
    assert value_disagreement("--norm", MILES, UPSTREAM, ours, theirs) == "--norm: miles True, upstream False"


def test_a_refusal_of_a_newer_upstream_flag_may_be_absent_upstream_but_not_differ_in_arity():
    refused = {"--use-opd": _record("refused_flags", nargs=0), "--opd-type": _record("refused_flags", nargs=None),
               "--gone": _record("refused_flags", nargs=0)}
    upstream = {"--opd-type": _record("opd_type", nargs="+")}
    problems = refusal_mismatches(refused, upstream, absent=frozenset({"--use-opd", "--opd-type"}))
    # --use-opd: newer than that parser, absent there: fine; --opd-type: present with another arity: a mismatch;
    # --gone: not marked newer and absent: stale
    assert problems == ["--gone: refused in departures.toml, but upstream has no such flag",
                        "--opd-type: refused with nargs None, upstream's is '+'"]
