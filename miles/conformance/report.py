"""``python -m miles.conformance``: miles' parser against upstream's, flag by flag and command line by command line.

Three checks, each against upstream's own parser in its own environment (``upstream_env``):

1. Every shared flag's dest, default, type, choices, action, nargs and required agree, or the difference is listed in
   ``departures.toml``; every listed difference still exists; every flag only miles has is listed as added.
2. Sample command lines (each shared flag that parses alike, with every choice or a value of its type) give the
   same value in both namespaces.
3. The async contract's verdict (``validate_async_off_policy_correction``) on upstream's namespace equals miles'
   (``miles-check``'s) for every estimator with every combination of the three corrections.

Exit status 0 when all hold, 1 otherwise, each failure printed.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from miles.check.launch import ASYNC_DRIVER, REJECTED, check_launch
from miles.config import corrections
from miles.config.arguments import build_parser, validate_async_off_policy_correction
from miles.config.departures import added_option_strings, load_additions, load_departures, load_refusals
from miles.conformance import compare
from miles.conformance.parser_spec import describe_parser, parse_command_line
from miles.conformance.upstream_env import DEFAULT_ENV_DIR, ensure_upstream_env, upstream_parser_dump
from miles.utils.errors import AsyncOffPolicyCorrectionError

_SAMPLE_VALUES = {"int": "3", "float": "0.25", "str": "sample"}
_FLAG_ONLY_ACTIONS = ("store_true", "store_false", "store_const", "boolean_optional")


def sample_command_lines(flag: str, record: dict) -> list[list[str]]:
    """Command lines that set ``flag`` (on top of ``BASE_COMMAND_LINE``): every choice, or one value of its type;
    none for a converter with no sample value (a flag with a function of its own as its type)."""
    if record["action"] in _FLAG_ONLY_ACTIONS:
        return [[*compare.BASE_COMMAND_LINE, flag]]
    if record["choices"] is not None:
        return [[*compare.BASE_COMMAND_LINE, flag, str(choice)] for choice in record["choices"]]
    value = _SAMPLE_VALUES.get(record["type"])
    if value is None:
        return []
    values = [value, value] if record["nargs"] in ("+", "*") else [value]
    return [[*compare.BASE_COMMAND_LINE, flag, *values]]


def contract_command_lines(estimators: list[str]) -> list[list[str]]:
    """Each estimator (miles' ``--advantage-estimator`` choices) with every subset of the three corrections."""
    flags = [row.flag for row in corrections.contract_corrections()]  # the corrections table's contract rows
    return [[*compare.BASE_COMMAND_LINE, "--advantage-estimator", estimator, *chosen]
            for estimator in estimators for size in range(len(flags) + 1)
            for chosen in itertools.combinations(flags, size)]


def contract_refuses(namespace: dict) -> bool:
    """The async contract's verdict on a namespace (upstream's, as ``{dest: value}``)."""
    try:
        validate_async_off_policy_correction(SimpleNamespace(**namespace))
    except AsyncOffPolicyCorrectionError:
        return True
    return False


@dataclass
class ConformanceReport:
    shared: int = 0
    refused: int = 0  # upstream flags miles' parser knows and refuses (departures.toml)
    differences: list = field(default_factory=list)
    failures: list = field(default_factory=list)  # one line each: what does not hold
    command_lines: int = 0

    def lines(self) -> list[str]:
        flags = len({d.flag for d in self.differences})
        verdict = (f"conformance: {len(self.failures)} failures" if self.failures else
                   "conformance: OK (every difference is listed in miles/config/departures.toml with its reason)")
        counts = (f"{self.shared} flags shared with upstream, {self.refused} refused; {len(self.differences)} fields "
                  f"differ, in {flags} of them; {self.command_lines} command lines parsed by both")
        return [counts,
                *(f"FAIL {failure}" for failure in self.failures), verdict]


def _flag_failures(report, miles_options, upstream_options, miles_defaults, upstream_defaults) -> None:
    departures = load_departures()
    report.shared = len(compare.shared_flags(miles_options, upstream_options))
    report.differences = compare.flag_differences(miles_options, upstream_options, miles_defaults, upstream_defaults)
    report.failures += [f"undocumented departure: {d}" for d in compare.undocumented(report.differences, departures)]
    report.failures += [f"listed in departures.toml but no longer different: {line}"
                        for line in compare.stale_listings(report.differences, departures)]
    report.failures += compare.wrong_default_listings(report.differences, departures)
    unlisted = set(compare.only_in_miles(miles_options, upstream_options)) - added_option_strings(load_additions())
    report.failures += [f"{flag}: only miles has it, and departures.toml does not list it as added"
                        for flag in sorted(unlisted)]
    report.failures += [f"{flag}: listed as a departure, but not a flag both parsers have" for flag in departures
                        if flag not in miles_options or flag not in upstream_options]


def _coverage_failures(report, all_miles_options, refused, upstream_options) -> None:
    """Every upstream flag is known to miles' parser (implemented or refused), and each refusal matches upstream."""
    report.refused = len(refused)
    report.failures += [f"upstream's {flag} is unknown to miles' parser: implement it or refuse it in "
                        "departures.toml" for flag in compare.unknown_upstream_flags(all_miles_options, upstream_options)]
    absent = frozenset(flag for flag, refusal in load_refusals().items() if refusal.absent_from_upstreams_parser)
    report.failures += compare.refusal_mismatches(refused, upstream_options, absent)


def _sample_failures(report, samples, parsed, miles_parser, miles_options, upstream_options) -> None:
    """Check 2: a shared flag that parses alike gives the same value on both sides."""
    departing = {d.flag for d in report.differences if d.field != "default"}
    for (flag, words), theirs in zip(samples, parsed):
        if flag not in upstream_options or flag in departing:
            continue
        ours = parse_command_line(miles_parser, words)
        if "error" in ours or "error" in theirs:
            report.failures.append(f"{' '.join(words)}: miles {ours.get('error', 'parses it')}; upstream "
                                   f"{theirs.get('error', 'parses it')}")
            continue
        disagreement = compare.value_disagreement(flag, miles_options, upstream_options, ours["namespace"],
                                                  theirs["namespace"])
        if disagreement is not None:
            report.failures.append(f"{' '.join(words)}: {disagreement}")


def _contract_failures(report, contract_lines, parsed) -> None:
    """Check 3: the contract's verdict on upstream's namespace is miles-check's on the same words."""
    for words, theirs in zip(contract_lines, parsed):
        ours = "refused" if check_launch(words, ASYNC_DRIVER).status == REJECTED else "accepted"
        if "error" in theirs:
            report.failures.append(f"train_async.py {' '.join(words)}: upstream's parser refuses it: {theirs['error']}")
        elif (upstream := "refused" if contract_refuses(theirs["namespace"]) else "accepted") != ours:
            report.failures.append(f"train_async.py {' '.join(words)}: the contract's verdict differs: miles {ours}, "
                                   f"upstream's namespace {upstream}")


def run_conformance(upstream_dump) -> ConformanceReport:
    """All three checks; ``upstream_dump(command_lines)`` gives upstream's parser records and namespaces
    (``upstream_env.upstream_parser_dump`` with the upstream environment's Python)."""
    miles_parser = build_parser()
    all_miles_options = describe_parser(miles_parser)
    miles_options, refused = compare.split_refused(all_miles_options)
    # every miles flag is sampled (which ones upstream shares is known only from the dump); the others are skipped
    samples = [(flag, words) for flag in sorted(miles_options) for words in sample_command_lines(flag, miles_options[flag])]
    contract_lines = contract_command_lines(miles_options["--advantage-estimator"]["choices"])
    upstream = upstream_dump([compare.BASE_COMMAND_LINE, *(words for _, words in samples), *contract_lines])
    upstream_options, (base, *parsed) = upstream["options"], upstream["namespaces"]
    report = ConformanceReport(command_lines=1 + len(samples) + len(contract_lines))
    miles_defaults = parse_command_line(miles_parser, compare.BASE_COMMAND_LINE)["namespace"]
    _flag_failures(report, miles_options, upstream_options, miles_defaults, base["namespace"])
    _coverage_failures(report, all_miles_options, refused, upstream_options)
    _sample_failures(report, samples, parsed[:len(samples)], miles_parser, miles_options, upstream_options)
    _contract_failures(report, contract_lines, parsed[len(samples):])
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m miles.conformance", description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-dir", default=str(DEFAULT_ENV_DIR),
                        help="Where the upstream environment is built once and reused. (default: %(default)s)")
    args = parser.parse_args(argv)
    python = ensure_upstream_env(Path(args.env_dir))
    report = run_conformance(lambda command_lines: upstream_parser_dump(python, command_lines))
    print("\n".join(report.lines()))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
