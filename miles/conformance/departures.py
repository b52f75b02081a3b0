"""The departures table (``departures.toml``): how miles' command line departs from upstream miles', each with its
reason, rendered into ``--help`` and docs/training.md. Standard library only: ``miles/config/flags.py`` reads it
for every ``--help``, and upstream's venv never imports it."""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

DEPARTURES_FILE = Path(__file__).with_name("departures.toml")
DOCS_BEGIN = "<!-- departures: rendered from miles/conformance/departures.toml by `python -m miles.conformance.departures` -->"
DOCS_END = "<!-- end of departures -->"


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


@functools.cache  # every build_parser() renders --help's epilog from it (parse_args, miles-check per launch)
def _load() -> dict:
    with DEPARTURES_FILE.open("rb") as file:
        return tomllib.load(file)


def load_departures() -> dict[str, Departure]:
    """Shared flag -> how it departs."""
    return {flag: Departure(**{**entry, "differs": tuple(entry["differs"])})
            for flag, entry in _load()["shared"].items()}


def load_additions() -> dict[str, Addition]:
    """Flag only miles has -> what it is for."""
    return {flag: Addition(entry["why"], tuple(entry.get("aliases", ()))) for flag, entry in _load()["added"].items()}


def load_math_departures() -> dict[str, MathDeparture]:
    """Function of upstream's math (at upstream's module path) -> how miles' departs, with the test of both."""
    return {name: MathDeparture(**entry) for name, entry in _load().get("math", {}).items()}


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


def render_into(text: str) -> str:
    """``text`` (docs/training.md) with its rendered section replaced by ``markdown()``."""
    head, found, rest = text.partition(DOCS_BEGIN)
    if not found or DOCS_END not in rest:
        raise ValueError(f"the document has no '{DOCS_BEGIN}' ... '{DOCS_END}' section")
    return f"{head}{DOCS_BEGIN}\n{markdown()}\n{DOCS_END}{rest.split(DOCS_END, 1)[1]}"


def main() -> None:
    """Rewrite docs/training.md's departures section from departures.toml."""
    docs = Path(__file__).resolve().parents[2] / "docs" / "training.md"
    docs.write_text(render_into(docs.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"rendered {DEPARTURES_FILE.name} into {docs}")


if __name__ == "__main__":
    main()
