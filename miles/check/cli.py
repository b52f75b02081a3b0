"""The ``miles-check`` command: scan scripts (or one argument list), print a verdict per launch, exit by class."""

import argparse
import json
import os
import sys

from miles.check.launch import DEPENDS, OK, REJECTED, Verdict, check_launch
from miles.check.script import ScriptScan, scan_script
from miles.check.shell import ASYNC_DRIVER, SYNC_DRIVER
from miles.config.sglang_words import router_option, sglang_option

# The exit status answers "would the driver refuse one of these launches?" (2 stays argparse's usage error).
EXIT_STATUS = {OK: 0, REJECTED: 1, DEPENDS: 3}
EXIT_EPILOG = (
    "The exit status is the async off-policy contract's verdict: a launch the contract does not refuse counts "
    "as 0 even where miles would refuse it for another reason (pipeline parallelism, a backend it lacks, a rank "
    "rule); that refusal is printed as a note. A train.py launch is never stale: 0. With --strict every refusal "
    "of miles' parser and rules counts. "
    "Exit status: 0 no launch is refused, and no launch's contract verdict could change with the words "
    "miles-check could not resolve; 1 a launch is REJECTED (the driver refuses it whatever the unresolved words "
    "hold; this wins over 3); 3 a launch DEPENDS on unresolved words: the contract's verdict, or a refusal, "
    "could change with them (an async launch with no correction and an array, or an unquoted or bare $VAR, "
    "in a flag position; an unresolved --advantage-estimator), or a launch miles-check cannot see into, or a "
    "script with no launch; 2 usage error. A train.py launch never depends on unresolved words for the contract. "
    "An unresolved word right after a flag is that flag's value: the flag counts as set; a rule that needs the "
    "value is a 'cannot check' note, not an error."
)


def format_verdict(location: str, driver: str, verdict: Verdict, uses_script_arguments: bool = False) -> list:
    """The report lines of one invocation: a header, then indented details."""
    lines = [f"{location}: {driver}: {verdict.status}; {verdict.contract}"]
    lines += [f"  depends on {word}: {why}" for word, why in verdict.depends_on]
    lines += [f"  unresolved (not guessed): {shown}: {reason}" for shown, reason in verdict.unresolved]
    lines += [f"  {note}" for note in verdict.cannot_check]
    if verdict.errors and not verdict.refusals_counted:
        lines.append("  note: miles would refuse this launch for a reason other than the contract "
                     "(not counted in the exit status; --strict counts it):")
    elif verdict.status == DEPENDS and verdict.errors:
        lines.append("  the resolved words alone are rejected:")
    for message, fix in verdict.errors:
        lines += ["  " + line for line in f"error: {message}".splitlines()]
        lines.append(f"  {fix}")
    sglang, router, unknown = _passed_words(verdict.ignored)
    if sglang:
        lines.append("  SGLang server arguments (with --rollout-backend sglang the preflight checks them with SGLang's "
                     "own parser and the engines get them; the contract does not read them): " + ", ".join(sglang))
    if router:
        lines.append("  sglang-router options (the preflight checks them with sglang-router's own parser and the router "
                     "miles starts gets them; the contract does not read them): " + ", ".join(router))
    if unknown:
        lines.append("  ignored (unknown to the miles parser; the contract does not read them): " + ", ".join(unknown))
    if uses_script_arguments:
        lines.append('  note: "$@" (the script\'s own arguments) is checked as empty')
    return lines


def _passed_words(ignored: list[str]) -> tuple[list[str], list[str], list[str]]:
    """The ignored words split into SGLang's (``--sglang-*``, ``--no-sglang-*``: miles passes them to SGLang,
    ``split_sglang_words``), sglang-router's (``--router-*``, ``split_router_words``) and the ones miles does not
    know at all."""
    sglang = [word for word in ignored if sglang_option(word) is not None]
    router = [word for word in ignored if router_option(word) is not None]
    return sglang, router, [word for word in ignored if sglang_option(word) is None and router_option(word) is None]


def launch_record(file, line, driver, verdict: Verdict) -> dict:
    """One launch as ``--format json`` prints it."""
    sglang, router, unknown = _passed_words(verdict.ignored)
    return {
        "file": file, "line": line, "driver": driver, "verdict": verdict.status,
        "exit_class": verdict.status.lower(), "exit_status": EXIT_STATUS[verdict.status],
        "contract": verdict.contract,
        "depends_on": [{"word": word, "why": why} for word, why in verdict.depends_on],
        "unresolved": [{"word": shown, "reason": reason} for shown, reason in verdict.unresolved],
        "cannot_check": verdict.cannot_check,
        "errors": [{"message": message, "fix": fix} for message, fix in verdict.errors],
        "ignored": unknown, "sglang_words": sglang, "router_words": router,
        "errors_counted": verdict.refusals_counted,
    }


def _unseen_record(file, line, command: str, reason: str) -> dict:
    """A launch miles-check cannot see into, or a script without one: its verdict depends on what it cannot read."""
    verdict = Verdict(DEPENDS, "contract: not checked", depends_on=[(command, reason)])
    return launch_record(file, line, None, verdict)


def _script_records(path: str, scan: ScriptScan, strict: bool) -> list:
    """(record, text lines) for each launch of one script, in the order found."""
    results = []
    for invocation in scan.invocations:
        verdict = check_launch(invocation.args, invocation.driver, strict)
        file = invocation.file or path
        location = f"{file}:{invocation.line}" + (f" (sourced by {path})" if invocation.file else "")
        lines = format_verdict(location, invocation.driver, verdict, invocation.uses_script_arguments)
        results.append((launch_record(file, invocation.line, invocation.driver, verdict), lines))
    for launcher in scan.launchers:
        file = launcher.file or path
        lines = [f"{file}:{launcher.line}: {DEPENDS}: {launcher.command}",
                 f"  unresolved (not guessed): {launcher.reason}"]
        results.append((_unseen_record(file, launcher.line, launcher.command, launcher.reason), lines))
    if not results:
        reason = "no train_async.py / train.py invocation found (nothing was checked)"
        lines = [f"{path}: {DEPENDS}: {reason}"]
        lines += [f"  python command seen, not a driver: {command}" for command in scan.python_commands]
        results.append((_unseen_record(path, None, path, reason), lines))
    return results


def _summary(records: list, files: int) -> str:
    statuses = [record["verdict"] for record in records]
    counts = {status: statuses.count(status) for status in dict.fromkeys(statuses)}
    shown = ", ".join(f"{count} {status}" for status, count in counts.items())
    return f"miles-check: {len(statuses)} result(s) in {files} file(s): {shown}"


def exit_status(records: list) -> int:
    statuses = {record["verdict"] for record in records}
    return next((EXIT_STATUS[status] for status in (REJECTED, DEPENDS) if status in statuses), 0)


def _build_cli() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="miles-check",
        usage="miles-check [--format {text,json}] [--strict] [--sync] -- ARGS...  |  miles-check [--format {text,json}] [--strict] "
        "SCRIPT.sh [SCRIPT.sh ...]",
        description="Check train_async.py / train.py launches against miles' parser, its rules and the async "
        "off-policy contract, without starting anything. What the script reader resolves (variables, arrays, "
        "read -a / mapfile / eval assignments, the SCRIPT_DIR idiom, source) and what it never guesses: the "
        "docstring of miles/check/__init__.py and docs/async_off_policy_contract.md.",
        epilog=EXIT_EPILOG,
    )
    parser.add_argument("scripts", nargs="*", metavar="SCRIPT.sh", help="Shell scripts to scan for launches.")
    parser.add_argument("--strict", action="store_true",
                        help="Count every refusal of miles' parser and rules in the exit status, not only the "
                        "async contract's.")
    parser.add_argument("--sync", action="store_true", help="With `-- ARGS`: check them as a train.py launch.")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="text: a report per launch and a summary line; json: one JSON array, one object per "
                        "launch (file, line, driver, verdict, exit_class, contract, depends_on, unresolved, "
                        "cannot_check, errors, ignored). (default: %(default)s)")
    return parser


def _read_scripts(parser: argparse.ArgumentParser, paths: list) -> list:
    texts = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                texts.append(handle.read())
        except OSError as error:
            parser.error(f"cannot read {path}: {error.strerror}")
    return texts


def _parse_cli(argv: list) -> tuple:
    """(options, the launch's argument list or None); argparse's SystemExit for usage errors and --help."""
    split = argv.index("--") if "--" in argv else len(argv)
    own, launch_args = argv[:split], (argv[split + 1:] if split < len(argv) else None)
    parser = _build_cli()
    options = parser.parse_args(own)
    if launch_args is None and not options.scripts:
        parser.error("give `-- ARGS...` to check one launch, or SCRIPT.sh files to scan")
    if launch_args is not None and options.scripts:
        parser.error("give either `-- ARGS...` or SCRIPT.sh files, not both")
    if options.sync and launch_args is None:
        parser.error("--sync applies to `-- ARGS...`; a script's driver is read from the script")
    options.texts = [] if launch_args is not None else _read_scripts(parser, options.scripts)
    return options, launch_args


def main(argv=None) -> int:
    """The ``miles-check`` console script; returns the exit status (EXIT_EPILOG)."""
    try:
        options, launch_args = _parse_cli(sys.argv[1:] if argv is None else list(argv))
    except SystemExit as exit_request:  # argparse's usage errors (2) and --help (0)
        return exit_request.code if isinstance(exit_request.code, int) else 2
    if launch_args is not None:
        driver = SYNC_DRIVER if options.sync else ASYNC_DRIVER
        verdict = check_launch(launch_args, driver, options.strict)
        results = [(launch_record(None, None, driver, verdict), format_verdict("command line", driver, verdict))]
    else:
        results = [result for path, text in zip(options.scripts, options.texts, strict=True)
                   for result in _script_records(path, scan_script(text, os.path.abspath(path)), options.strict)]
    records = [record for record, _ in results]
    if options.format == "json":
        print(json.dumps(records, indent=2))
    else:
        print("\n".join(line for _, lines in results for line in lines))
        if launch_args is None:
            print(_summary(records, len(options.texts)))
    return exit_status(records)
