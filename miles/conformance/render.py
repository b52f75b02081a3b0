"""Renders the departures table and miles' parser into the docs: docs/training.md's departures section,
docs/conformance.md's refused flags and its table of flag groups. Run ``python -m miles.conformance.render`` after
changing miles/config/flags.py or miles/config/departures.toml; a fast test fails when the docs drift."""

from pathlib import Path

from miles.config.arguments import build_parser
from miles.config.departures import (
    DEPARTURES_FILE,
    DOCS_BEGIN,
    DOCS_END,
    GROUPS_BEGIN,
    GROUPS_END,
    REFUSED_BEGIN,
    REFUSED_END,
    added_option_strings,
    load_additions,
    markdown,
    refused_groups,
    refused_markdown,
    render_into,
)
from miles.config.refused import implemented_actions


def groups_markdown() -> str:
    """docs/conformance.md's one table of flag groups: each group of miles' parser, implemented (its upstream flags
    and the flags miles adds counted apart), then each refused group with its reason."""
    parser, added = build_parser(), added_option_strings(load_additions())
    implemented = {id(action) for action in implemented_actions(parser)}
    rows = ["| group | here | upstream flags | flags miles adds | why |", "|---|---|---|---|---|"]
    for group in parser._action_groups:
        flags = [max(action.option_strings, key=len) for action in group._group_actions
                 if id(action) in implemented and action.option_strings and action.dest != "help"]
        if flags:
            ours = sum(flag in added for flag in flags)
            rows.append(f"| {group.title} | implemented | {len(flags) - ours} | {ours} | upstream's meaning; the "
                        "defaults that depart are in docs/training.md |")
    for group, row in refused_groups().items():
        count = len([*row.get("switches", ()), *row.get("values", ()), *row.get("nargs", {})])
        rows.append(f"| {group} | refused | {count} | 0 | {row['why']} |")
    return "\n".join(rows)


def main() -> None:
    """Rewrite the rendered sections of docs/training.md and docs/conformance.md."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    for name, begin, end, body in (("training.md", DOCS_BEGIN, DOCS_END, markdown),
                                   ("conformance.md", REFUSED_BEGIN, REFUSED_END, refused_markdown),
                                   ("conformance.md", GROUPS_BEGIN, GROUPS_END, groups_markdown)):
        path = docs / name
        path.write_text(render_into(path.read_text(encoding="utf-8"), begin, end, body), encoding="utf-8")
        print(f"rendered {DEPARTURES_FILE.name} into {path}")


if __name__ == "__main__":
    main()
