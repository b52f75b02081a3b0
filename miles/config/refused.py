"""Upstream flags miles refuses, registered on the parser from the departures table, so a launch script written
for upstream miles never meets argparse's "unrecognized arguments" for them.

Each ``[refused."group"]`` row of ``miles/config/departures.toml`` lists upstream flags with upstream's arity;
each becomes a ``RefusedFlag`` action (hidden from ``--help``; docs/conformance.md renders the table). Parsing one
records it; ``refusal_line`` then names every refused flag of the launch at once, grouped by reason, and the
driver stops there (exit 2, before Ray starts). A value the row ``accepts`` means what miles does anyway
(``--context-parallel-size 1``), so it parses and records nothing. Standard library only, like the parser.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from miles.config.departures import Refusal

REFUSED_DEST = "refused_flags"  # (flag word as given, its Refusal), in command-line order
ACCEPTED_DEST = "accepted_upstream_flags"  # likewise, the flags of accepted groups (a row with ``here``)
SWITCH_ON = "on"  # an ``accepts`` entry for a switch: giving it is accepted
DOCS = "docs/conformance.md#refused-upstream-flags"


class RefusedFlag(argparse.Action):
    def __init__(self, option_strings, dest, refusal: Refusal, **kwargs):
        self.refusal = refusal
        super().__init__(option_strings, REFUSED_DEST, nargs=refusal.nargs, default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        words = [] if self.nargs == 0 else [values] if isinstance(values, str) else list(values)
        accepted = is_accepted(self.refusal, words)
        if accepted and not self.refusal.here:
            return  # what miles does anyway: nothing to say
        shown = " ".join([option_string, *words])
        dest = ACCEPTED_DEST if accepted else REFUSED_DEST
        setattr(namespace, dest, [*getattr(namespace, dest, []), (shown, self.refusal)])


def is_accepted(refusal: Refusal, words: list[str]) -> bool:
    """Whether the flag with these value words means what miles does anyway (numbers compare as numbers)."""
    if not words:
        return SWITCH_ON in refusal.accepts
    return all(any(_same(word, accepted) for accepted in refusal.accepts) for word in words)


def _same(word: str, accepted: str) -> bool:
    try:
        return float(word) == float(accepted)
    except ValueError:
        return word == accepted


def add_refused_arguments(parser: argparse.ArgumentParser) -> None:
    """Every refused upstream flag, one ``RefusedFlag`` each (hidden from --help). A flag the parser already defines
    (a driver's or a plug-in's, registered first when the refused flags are added late) keeps its definition: the
    code that defines it is what it means, as when it is added after them."""
    from miles.config.departures import load_refusals  # parsed here, not when the parser's module is imported

    group = parser.add_argument_group("refused upstream flags")
    for flag, refusal in load_refusals().items():
        if flag not in parser._option_string_actions:  # argparse's table of the option strings it knows
            group.add_argument(flag, action=RefusedFlag, refusal=refusal)


def implemented_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's actions other than the refused upstream flags: the flags miles implements."""
    return [action for action in parser._actions if not isinstance(action, RefusedFlag)]


def accepted_lines(namespace: argparse.Namespace) -> list[str]:
    """One startup line per accepted group the launch used (what it asked for, what runs here instead); removes
    the record from the namespace, so the run's ``args`` never carries it."""
    by_group: dict[str, list] = {}
    for shown, refusal in vars(namespace).pop(ACCEPTED_DEST, []):
        by_group.setdefault(refusal.group, []).append((shown, refusal))
    return [f"accepted upstream flags {', '.join(shown for shown, _ in items)}: {items[0][1].why}; here "
            f"{items[0][1].here}: the same numbers ({DOCS})" for items in by_group.values()]


def refusal_line(namespace: argparse.Namespace) -> str | None:
    """One line naming every refused flag in ``namespace`` with its group's reason, or None; removes the record
    from the namespace, so the run's ``args`` never carries it."""
    refused = vars(namespace).pop(REFUSED_DEST, [])
    if not refused:
        return None
    by_group: dict[str, list] = {}
    for shown, refusal in refused:
        by_group.setdefault(refusal.group, []).append((shown, refusal))
    parts = []
    for group, items in by_group.items():
        accepted = [f"{shown.split()[0]} {' or '.join(r.accepts)}" for shown, r in items if r.accepts]
        accepted_note = f" (accepted: {', '.join(accepted)})" if accepted else ""
        parts.append(f"{', '.join(shown for shown, _ in items)}: {items[0][1].why}{accepted_note}")
    return (f"upstream flags miles refuses: {'; '.join(parts)}. Drop them from the launch ({DOCS} lists every "
            "refused flag and why).")
