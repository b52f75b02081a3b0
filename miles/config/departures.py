"""The departures table (``departures.toml``): how miles' command line departs from upstream miles', each with its
reason, rendered into ``--help`` and (by ``miles.conformance.render``) the docs. Standard library only:
``miles/config/flags.py`` reads it for every ``--help``, and upstream's venv never imports it."""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

DEPARTURES_FILE = Path(__file__).with_name("departures.toml")
DOCS_BEGIN = "<!-- departures: rendered from miles/config/departures.toml by `python -m miles.conformance.render` -->"
DOCS_END = "<!-- end of departures -->"
REFUSED_BEGIN = ("<!-- refused flags: rendered from miles/config/departures.toml by `python -m "
                 "miles.conformance.render` -->")
REFUSED_END = "<!-- end of refused flags -->"
GROUPS_BEGIN = ("<!-- flag groups: rendered from miles/config/flags.py and miles/config/departures.toml by "
                "`python -m miles.conformance.render` -->")
GROUPS_END = "<!-- end of flag groups -->"


@dataclass(frozen=True)
class Departure:
    differs: tuple = ()
    miles: object = None
    upstream: object = None
    why: str = ""
    miles_shown: str | None = None
    upstream_shown: str | None = None

    def shown(self, side: str) -> str:
        value = getattr(self, f"{side}_shown") or getattr(self, side)
        if isinstance(value, bool):
            return "on" if value else "off"
        return str(value)


Departure.NONE = Departure()


@dataclass(frozen=True)
class Addition:
    why: str
    aliases: tuple = field(default=())


@dataclass(frozen=True)
class MathDeparture:
    miles: str
    upstream: str
    why: str
    test: str  # the test that shows both behaviors


@dataclass(frozen=True)
class Refusal:
    """An upstream flag miles' parser knows and refuses (``[refused."group"]`` rows)."""

    group: str
    why: str
    nargs: object  # as upstream's parser reads it: 0 (a switch), None (one value), "+", "*" or a count
    accepts: tuple = ()  # the values that mean what miles does anyway ("on": the switch itself)
    # the upstream commit a flag newer than the conformance check's parser (miles-rl 0.0.2) was seen at ("": the
    # parser has it): such a flag is known here although that parser cannot confirm it
    newer_upstream: str = ""
    # the code that defines a flag upstream's parser never has ("": the parser or a newer upstream's): an upstream
    # example's own driver or a generate function's add_arguments; that code's definition replaces the refusal
    defined_by: str = ""
    # an accepted group's (docs/conformance.md, "Accepted upstream flags"): what runs here instead, said at startup
    here: str = ""

    @property
    def absent_from_upstreams_parser(self) -> bool:
        return bool(self.newer_upstream or self.defined_by)


@functools.cache  # read by --help's epilog, the refused flags (when a parse meets one) and the conformance tools
def _load() -> dict:
    with DEPARTURES_FILE.open("rb") as file:
        return tomllib.load(file)


def load_departures() -> dict[str, Departure]:
    """Shared flag -> how it departs."""
    return {flag: Departure(**{**entry, "differs": tuple(entry["differs"])})
            for flag, entry in _load()["shared"].items()}


def upstream_choice(option_strings, value: str) -> Departure | None:
    """The departure of a flag whose choices differ from upstream's, when upstream's choices hold ``value``
    (``--train-backend fsdp``): None for a value neither side accepts."""
    departures = load_departures()
    for option in option_strings:
        departure = departures.get(option, Departure.NONE)
        if "choices" in departure.differs and value in re.findall(r"[\w.-]+", str(departure.upstream)):
            return departure
    return None


def load_additions() -> dict[str, Addition]:
    """Flag only miles has -> what it is for."""
    return {flag: Addition(entry["why"], tuple(entry.get("aliases", ()))) for flag, entry in _load()["added"].items()}


def load_math_departures() -> dict[str, MathDeparture]:
    """Function of upstream's math (at upstream's module path) -> how miles' departs, with the test of both."""
    return {name: MathDeparture(**entry) for name, entry in _load().get("math", {}).items()}


def load_refusals() -> dict[str, Refusal]:
    """Upstream flag miles refuses -> its group, reason, arity and accepted values."""
    refusals = {}
    for group, row in _load().get("refused", {}).items():
        arity = {**dict.fromkeys(row.get("switches", ()), 0), **dict.fromkeys(row.get("values", ())),
                 **{flag: int(n) if n.isdigit() else n for flag, n in row.get("nargs", {}).items()}}
        for flag, nargs in arity.items():
            refusals[flag] = Refusal(group, row["why"], nargs, tuple(row.get("accepts", {}).get(flag, ())),
                                     row.get("newer", {}).get(flag, row.get("newer_upstream", "")),
                                     row.get("defined_by", ""), row.get("here", ""))
    return refusals


def refused_groups() -> dict[str, dict]:
    """Group -> its row (why, accepts, the flags), in the file's order: the docs' table of refused flags."""
    return _load().get("refused", {})


def added_option_strings(additions: dict[str, Addition]) -> set[str]:
    return {option for flag, addition in additions.items() for option in (flag, *addition.aliases)}


def _added_name(flag: str, addition: Addition) -> str:
    return "/".join((flag, *addition.aliases))


def help_lines() -> list[str]:
    """The end of ``--help``: every departure and every added flag, one line each."""
    lines = ["defaults and choices that depart from upstream miles (docs/training.md, 'Departures from upstream'):"]
    for flag, departure in load_departures().items():
        lines.append(f"  {flag} ({', '.join(departure.differs)}): {departure.shown('miles')} "
                     f"(upstream: {departure.shown('upstream')}): {departure.why}")
    lines += ["", "flags miles adds:"]
    lines += [f"  {_added_name(flag, addition)}: {addition.why}" for flag, addition in load_additions().items()]
    return lines


def markdown() -> str:
    """docs/training.md's departures section body, between ``DOCS_BEGIN`` and ``DOCS_END``."""
    rows = ["| flag | differs in | miles | upstream | why |", "|---|---|---|---|---|"]
    for flag, departure in load_departures().items():
        rows.append(f"| `{flag}` | {', '.join(departure.differs)} | {departure.shown('miles')} | "
                    f"{departure.shown('upstream')} | {departure.why} |")
    rows += ["", "Flags miles adds:", ""]
    rows += [f"- `{_added_name(flag, addition)}`: {addition.why}" for flag, addition in load_additions().items()]
    rows += ["", "Math that departs from upstream's on purpose (functions of "
             "`miles/backends/training_utils/loss_hub/math_utils.py`, upstream's module path):", "",
             "| function | miles | upstream | why | both behaviors in |", "|---|---|---|---|---|"]
    rows += [f"| `{name}` | {d.miles} | {d.upstream} | {d.why} | `{d.test}` |"
             for name, d in load_math_departures().items()]
    return "\n".join(rows)


def refused_markdown() -> str:
    """docs/conformance.md's table of the upstream flags miles refuses, one row per group."""
    rows = ["| group | flags | accepted | why |", "|---|---|---|---|"]
    for group, row in refused_groups().items():
        flags = [*row.get("switches", ()), *row.get("values", ()), *row.get("nargs", {})]
        accepted = ", ".join(f"`{flag} {' or '.join(values)}`".replace(" on`", "`")
                             for flag, values in row.get("accepts", {}).items()) or "none"
        origin = (f" (flags of upstream at {row['newer_upstream']}, newer than the conformance check's parser)"
                  if row.get("newer_upstream") else
                  f" (defined by {row['defined_by']}, not by upstream's parser)" if row.get("defined_by") else "")
        flags_by_commit: dict[str, list[str]] = {}
        for flag, commit in row.get("newer", {}).items():
            flags_by_commit.setdefault(commit, []).append(f"`{flag}`")
        origin += "".join(f" ({', '.join(newer)}: upstream at {commit}, newer than the conformance check's parser)"
                          for commit, newer in flags_by_commit.items())
        here = f"; here: {row['here']} (accepted: every upstream value, said once at startup)" if "here" in row else ""
        rows.append(f"| {group} ({len(flags)}) | {', '.join(f'`{flag}`' for flag in flags)} | {accepted} | "
                    f"{row['why']}{here}{origin} |")
    return "\n".join(rows)


def render_into(text: str, begin: str = DOCS_BEGIN, end: str = DOCS_END, body=markdown) -> str:
    """``text`` with its rendered section (between ``begin`` and ``end``) replaced by ``body()``."""
    head, found, rest = text.partition(begin)
    if not found or end not in rest:
        raise ValueError(f"the document has no '{begin}' ... '{end}' section")
    return f"{head}{begin}\n{body()}\n{end}{rest.split(end, 1)[1]}"
