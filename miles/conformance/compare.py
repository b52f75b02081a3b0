"""Comparing miles' parser with upstream's, flag by flag (pure functions over ``parser_spec`` records).

A shared flag (a long option both parsers accept) differs in a field when its records disagree on ``dest``,
``type``, ``choices``, ``action``, ``nargs`` or ``required``, or on ``default``: the value each namespace holds
when the flag is not given (upstream's after its default-setting step). Every difference must be listed in
``departures.toml`` with its reason; a listed field that no longer differs is stale. Both fail the conformance
check (docs/conformance.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from miles.config.departures import Departure
from miles.config.sglang_words import router_option, sglang_option  # SGLang's and sglang-router's: their parsers check them

RECORD_FIELDS = ("dest", "type", "choices", "action", "nargs", "required")
# The command line both parsers read for their defaults: upstream requires --rollout-batch-size, so both get miles'
# default (the "required" field records that departure).
BASE_COMMAND_LINE = ["--rollout-batch-size", "16"]


@dataclass(frozen=True)
class Difference:
    flag: str
    field: str
    miles: object
    upstream: object

    def __str__(self) -> str:
        return f"{self.flag}: {self.field} is {self.miles!r} in miles, {self.upstream!r} upstream"


def shared_flags(miles_options: dict, upstream_options: dict) -> list[str]:
    return sorted(set(miles_options) & set(upstream_options))


def flag_differences(miles_options: dict, upstream_options: dict, miles_defaults: dict, upstream_defaults: dict):
    """Every (flag, field) in which a shared flag differs, ``default`` from the namespaces of
    ``BASE_COMMAND_LINE`` (``{dest: value}``)."""
    differences = []
    for flag in shared_flags(miles_options, upstream_options):
        ours, theirs = miles_options[flag], upstream_options[flag]
        for name in RECORD_FIELDS:
            if ours[name] != theirs[name]:
                differences.append(Difference(flag, name, ours[name], theirs[name]))
        ours_default, theirs_default = miles_defaults[ours["dest"]], upstream_defaults[theirs["dest"]]
        if ours_default != theirs_default:
            differences.append(Difference(flag, "default", ours_default, theirs_default))
    return differences


def undocumented(differences: list[Difference], departures: dict[str, Departure]) -> list[Difference]:
    """The differences no departure lists."""
    return [d for d in differences if d.field not in departures.get(d.flag, Departure.NONE).differs]


def stale_listings(differences: list[Difference], departures: dict[str, Departure]) -> list[str]:
    """``"--flag: field"`` for each listed field in which the flag no longer differs (a departure of meaning,
    which no parser shows, is never stale)."""
    found = {(d.flag, d.field) for d in differences}
    return [f"{flag}: {name}" for flag, departure in departures.items() for name in departure.differs
            if name != "meaning" and (flag, name) not in found]


def wrong_default_listings(differences: list[Difference], departures: dict[str, Departure]) -> list[str]:
    """A listed default departure whose ``miles`` or ``upstream`` value is not the parsers' (so the table in
    ``--help`` and the docs says what the code does)."""
    wrong = []
    for d in differences:
        departure = departures.get(d.flag)
        if d.field != "default" or departure is None or "default" not in departure.differs:
            continue
        for side, listed, actual in (("miles", departure.miles, d.miles), ("upstream", departure.upstream, d.upstream)):
            if not _same_value(listed, actual):
                wrong.append(f"{d.flag}: departures.toml says {side} {listed!r}, the parser has {actual!r}")
    return wrong


def _same_value(listed, actual) -> bool:
    if actual is None:
        return listed == "none"
    if isinstance(actual, bool):
        return listed is actual  # TOML's true/false; 1 == True must not pass
    if not isinstance(actual, (int, float)):
        return listed == actual
    return isinstance(listed, (int, float)) and not isinstance(listed, bool) and float(listed) == float(actual)


REFUSED_ACTION = "RefusedFlag"  # parser_spec's name for miles/config/refused.py's action


def split_refused(miles_options: dict) -> tuple[dict, dict]:
    """(the flags miles implements, the upstream flags it refuses), each ``{flag: record}``."""
    refused = {flag: record for flag, record in miles_options.items() if record["action"] == REFUSED_ACTION}
    return {flag: record for flag, record in miles_options.items() if flag not in refused}, refused


def unknown_upstream_flags(miles_options: dict, upstream_options: dict) -> list[str]:
    """Upstream's flags that miles' parser does not know at all (neither implemented nor refused), each with its
    arity, as the departures table would list it; ``--sglang-*`` and ``--no-sglang-*`` ones are SGLang's, ``--router-*``
    ones sglang-router's."""
    return [f"{flag} (nargs {record['nargs']!r}, {record['action']})" for flag, record in sorted(upstream_options.items())
            if flag not in miles_options and sglang_option(flag) is None and router_option(flag) is None]


def refusal_mismatches(refused: dict, upstream_options: dict, absent: frozenset = frozenset()) -> list[str]:
    """A refused flag upstream lacks (stale), or one that takes a different number of words than upstream's (a
    launch would parse differently). ``absent``: refused flags the parser compared with lacks by design (their row
    names a newer upstream commit, or the example code that defines them); a different arity is still a mismatch."""
    problems = []
    for flag, record in sorted(refused.items()):
        if flag not in upstream_options and flag in absent:
            continue
        if flag not in upstream_options:
            problems.append(f"{flag}: refused in departures.toml, but upstream has no such flag")
        elif record["nargs"] != upstream_options[flag]["nargs"]:
            problems.append(f"{flag}: refused with nargs {record['nargs']!r}, upstream's is "
                            f"{upstream_options[flag]['nargs']!r}")
    return problems


def only_in_miles(miles_options: dict, upstream_options: dict) -> list[str]:
    return sorted(set(miles_options) - set(upstream_options))


def value_disagreement(flag: str, miles_options: dict, upstream_options: dict, miles_ns: dict,
                       upstream_ns: dict) -> str | None:
    """For one command line parsed by both: how ``flag``'s value differs between the namespaces, or None."""
    ours, theirs = miles_ns[miles_options[flag]["dest"]], upstream_ns[upstream_options[flag]["dest"]]
    return None if ours == theirs else f"{flag}: miles {ours!r}, upstream {theirs!r}"
