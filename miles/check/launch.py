"""Checking one launch's argument list with the real parser and rules, and whether its unresolved words matter.

Words the script does not determine are placed before the parser sees them. An unresolved word right after a
flag that takes a value (or after a flag miles does not know, as upstream's Megatron flags take values) is that
flag's value: the flag counts as set, to a value no rule may read (``UnknownValue``). Any other unresolved word
is in a flag position; it *could add a flag* when it may begin with ``-`` or stand for several words (an array,
an unquoted expansion). Whether the contract's verdict could change follows from where those words sit, never
from what they might hold (``_contract``).
"""

import argparse
import io
import re
from contextlib import redirect_stdout
from dataclasses import dataclass, field

from miles.check.shell import ASYNC_DRIVER, SYNC_DRIVER, Unresolved
from miles.config import corrections
from miles.config.refused import DOCS as REFUSED_DOCS
from miles.config.refused import RefusedFlag, refusal_line
from miles.config.arguments import (
    add_plugin_arguments,
    build_parser,
    check_async_colocation,
    check_async_max_weight_staleness,
    miles_validate_args,
    validate_async_off_policy_correction,
)
from miles.utils.errors import AsyncOffPolicyCorrectionError, MilesConfigError

OK, REJECTED, DEPENDS = "OK", "REJECTED", "DEPENDS"
CONTRACT_FIX = (
    f"fix: add {corrections.suggested_fix()} to the train_async.py arguments, "
    "or train synchronously with train.py"
)
REFUSAL_FIX = f"fix: drop the refused flags from the launch ({REFUSED_DOCS} says why each is refused)"
_ESTIMATOR = "advantage_estimator"
_NEGATIVE_NUMBER = re.compile(r"-\d[\d.e+-]*")
_FLAG_WITH_VALUE = re.compile(r"(-[^=$`]+)=")  # the literal "--flag=" that starts an unresolved word


@dataclass
class Verdict:
    status: str  # OK, REJECTED or DEPENDS
    contract: str  # one line: the contract's verdict on its own
    errors: list[tuple[str, str]] = field(default_factory=list)  # (exact message, "fix: ..." line)
    ignored: list[str] = field(default_factory=list)  # flags the parser does not know, with their values
    unresolved: list[tuple[str, str]] = field(default_factory=list)  # ("--lr ${LR}", why), one per word
    depends_on: list[tuple[str, str]] = field(default_factory=list)  # (word, how it could change the verdict)
    cannot_check: list[str] = field(default_factory=list)  # rules that need a value that is unresolved
    # False: the status is the contract's alone, and the errors other than the contract's are printed as a note
    # (miles would refuse the launch for another reason); --strict counts every refusal
    refusals_counted: bool = True


class UnknownValueRead(Exception):
    """A rule read the value of a flag that is set to an unresolved word."""

    def __init__(self, value: "UnknownValue"):
        super().__init__(f"{value.flag} {value.text}")
        self.value = value


class UnknownValue:
    """The value of a flag set to an unresolved word: ``is None`` is False (the flag is set), and any other use
    (comparison, truth, arithmetic, formatting) raises ``UnknownValueRead``, so a rule that needs the value
    becomes a "cannot check" note instead of an error computed from a default."""

    __slots__ = ("flag", "text")

    def __init__(self, flag: str, text: str):
        self.flag, self.text = flag, text

    def __repr__(self) -> str:  # argparse and the derivation log print values with repr
        return f"<{self.flag} {self.text}: unresolved>"

    def _read(self, *args, **kwargs):
        raise UnknownValueRead(self)

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __hash__ = _read
    __int__ = __float__ = __index__ = __str__ = __format__ = __len__ = __iter__ = __contains__ = _read
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _read
    __mod__ = __rmod__ = __neg__ = __abs__ = _read

    def __getattr__(self, name):  # .startswith(...) and friends
        raise UnknownValueRead(self)


@dataclass
class _Placement:
    """Where a launch's unresolved words sit, and the argv of its resolved words."""

    argv: list = field(default_factory=list)
    unresolved: list = field(default_factory=list)  # (word as shown, why it is unresolved)
    unknown_values: dict = field(default_factory=dict)  # dest -> UnknownValue
    flag_words: list = field(default_factory=list)  # (argv position, word, dests it could add or None: any)
    estimator_position: int | None = None  # argv index of the last resolved flag that sets the estimator
    refusal_depends: list = field(default_factory=list)  # (refused flag, its unresolved word, accepted values)


class _UsageError(Exception):
    """What the driver's argparse would have printed before exiting 2."""


def _raise_usage_error(message: str):
    raise _UsageError(message)


def _refuse_exit(status: int = 0, message=None):
    raise _UsageError("-h/--help prints the driver's help and exits: there is nothing to check")


def _checking_parser() -> argparse.ArgumentParser:
    """The real parser, made to raise instead of printing and exiting (checking starts nothing)."""
    parser = build_parser()
    parser.error = _raise_usage_error
    parser.exit = _refuse_exit
    return parser


def _parse_known(parser: argparse.ArgumentParser, argv: list) -> tuple:
    with redirect_stdout(io.StringIO()):  # a --help among the arguments must not print
        return parser.parse_known_args(argv)


def _action_for(parser: argparse.ArgumentParser, word: str):
    """The parser's action for a flag word (``--flag``, ``--flag=v``, or an abbreviation argparse accepts)."""
    flag = word.split("=", 1)[0]
    if not flag.startswith("-") or _NEGATIVE_NUMBER.fullmatch(flag):
        return None
    actions = parser._option_string_actions  # argparse's own table of option strings
    if flag in actions:
        return actions[flag]
    matches = {actions[option] for option in actions if flag.startswith("--") and option.startswith(flag)}
    return matches.pop() if len(matches) == 1 else None


def _awaits_value(parser: argparse.ArgumentParser, word: str) -> bool:
    """Whether the next word is this flag's value: a known flag that takes one, or a flag miles does not know."""
    if not word.startswith("-") or "=" in word or _NEGATIVE_NUMBER.fullmatch(word) or word == "--":
        return False
    action = _action_for(parser, word)
    return action is None or action.nargs != 0


def _could_add_a_flag(word: Unresolved) -> bool:
    return word.several or word.unquoted or word.text[:1] in ("$", "`", "-")


def _flags_it_could_add(word: Unresolved, parser: argparse.ArgumentParser):
    """The dests of the known flags a word in a flag position could add (from the words it could hold), or
    None when it could hold anything."""
    if word.could_hold is None:
        return None
    placed = _place_unresolved(list(word.could_hold), parser)
    dests = {action.dest for action in map(lambda held: _action_for(parser, held), placed.argv) if action}
    for _, _, inner in placed.flag_words:
        if inner is None:
            return None
        dests |= inner
    return frozenset(dests | placed.unknown_values.keys())


def _adds(dests, wanted: set, what: str) -> str | None:
    """Why a word in a flag position matters (None: it cannot add any of ``wanted``)."""
    if dests is None:
        return f"in a flag position, it could add {what}"
    hits = ", ".join("--" + dest.replace("_", "-") for dest in sorted(wanted & dests))
    return f"in a flag position, it could add {hits}" if hits else None


def _place_unresolved(args: list, parser: argparse.ArgumentParser) -> _Placement:
    """Sort a launch's words: resolved ones form the argv; each unresolved one is a flag's value (the flag
    counts as set), or sits in a flag position, where it could add a flag (``_could_add_a_flag``)."""
    placed, pending = _Placement(), None  # pending: the flag word whose value comes next
    for word in args:
        if isinstance(word, str):
            is_value = pending is not None and (not word.startswith("-") or bool(_NEGATIVE_NUMBER.fullmatch(word)))
            action = None if is_value else _action_for(parser, word)
            if action is not None:  # set here, after any unresolved value it had before
                placed.unknown_values.pop(action.dest, None)
            if action is not None and action.dest == _ESTIMATOR:
                placed.estimator_position = len(placed.argv)
            placed.argv.append(word)
            pending = word if not is_value and _awaits_value(parser, word) else None
            continue
        literal_flag = _FLAG_WITH_VALUE.match(word.text)
        flag = pending or (literal_flag[1] if literal_flag and _awaits_value(parser, literal_flag[1]) else None)
        if flag is not None:  # a value: of a known flag (now set, value unknown) or of a flag miles ignores
            _place_value(placed, _action_for(parser, flag), flag, word, after_flag=pending is not None)
            shown = f"{flag} {word.text}" if pending else word.text
        else:
            shown = word.text
        if (flag is None and _could_add_a_flag(word)) or (pending and word.several):
            placed.flag_words.append((len(placed.argv), word, _flags_it_could_add(word, parser)))
        placed.unresolved.append((shown, word.reason))
        pending = None
    return placed


def _place_value(placed: _Placement, action, flag: str, word: Unresolved, after_flag: bool) -> None:
    """An unresolved word that is ``flag``'s value (the word after it, or ``--flag=...``)."""
    if isinstance(action, RefusedFlag) and not action.refusal.accepts:
        placed.argv.append(word.text)  # refused whatever the word holds: the driver refuses it, shown as written
        return
    if action is not None and after_flag:
        placed.argv.pop()
    if isinstance(action, RefusedFlag):  # refused unless the word holds an accepted value: a cannot-check note
        placed.refusal_depends.append((flag, word.text, action.refusal.accepts))
    elif action is not None:  # a known flag: set, its value unknown
        placed.unknown_values[action.dest] = UnknownValue(flag, word.text)


def _unknown_flags(parser: argparse.ArgumentParser, argv: list) -> list:
    """The flags of ``argv`` the parser does not know, each with the words up to the next flag, as
    ``_group_flags`` writes them: what parse_known_args would return had argparse not stopped at an error first."""
    extras, in_unknown = [], False
    for token in argv:
        if token.startswith("-") and not _NEGATIVE_NUMBER.fullmatch(token):
            in_unknown = _action_for(parser, token) is None
        if in_unknown:
            extras.append(token)
    return _group_flags(extras)


def _group_flags(extras: list) -> list:
    """["--tp", "2", "--sp"] -> ["--tp 2", "--sp"]: each unknown flag with the values that follow it."""
    groups = []
    for token in extras:
        if token.startswith("-") and not _NEGATIVE_NUMBER.fullmatch(token) or not groups:
            groups.append(token)
        else:
            groups[-1] += f" {token}"
    return groups


def _fix_line(error: MilesConfigError) -> str:
    """The contract has its own fix; every other miles error ends with its fix sentence (house rule)."""
    if isinstance(error, AsyncOffPolicyCorrectionError):
        return CONTRACT_FIX
    sentence = re.split(r"(?<=[.!?])\s+", str(error).strip())[-1]
    return "fix: " + sentence[:1].lower() + sentence[1:]


def _validation_errors(args, driver: str) -> tuple:
    """Run the checks the driver runs, each one even when an earlier one failed.

    Returns (errors, contract error, cannot-check notes). A check that reads a value left unresolved stops
    there and becomes a note: its verdict is unknown, not an error.
    """
    errors, contract_error, cannot_check = [], None, []
    checks = [miles_validate_args]
    if driver == ASYNC_DRIVER:
        checks += [check_async_colocation, validate_async_off_policy_correction, check_async_max_weight_staleness]
    for check in checks:
        if check is validate_async_off_policy_correction and not hasattr(args, "use_critic"):
            continue  # the estimator is unresolved: _contract says what the verdict depends on
        try:
            check(args)
        except MilesConfigError as error:
            errors.append((str(error), _fix_line(error)))
            if isinstance(error, AsyncOffPolicyCorrectionError):
                contract_error = error
        except UnknownValueRead as read:
            cannot_check.append(f"cannot check: a rule in {check.__name__} reads {read.value.flag}, whose value "
                                f"{read.value.text} is unresolved (that check's later rules are not checked)")
    return errors, contract_error, cannot_check


def _contract(args, driver: str, contract_error, placed: _Placement) -> tuple:
    """The contract's verdict from the resolved words, and the unresolved words that could change it.

    Determinate when: the driver is train.py (never stale); or a correction flag is set (a word can add
    flags, not remove one, so the launch passes whatever the estimator); or, with no correction, the estimator
    is resolved and no word that could add a flag sits where it would count: anywhere for ppo (it could add a
    correction), after the last --advantage-estimator for a critic-free one (it could set ppo).
    """
    if driver == SYNC_DRIVER:
        return "contract: not applicable (train.py is synchronous, never stale)", []
    chosen = ", ".join(row.flag for row in corrections.chosen(args) if row.satisfies_contract)
    estimator = placed.unknown_values.get(_ESTIMATOR)
    if chosen and estimator is not None:
        return f"contract: OK ({chosen}, whatever {estimator.flag} {estimator.text} is)", []
    if chosen:
        return (f"contract: OK ({chosen})" if args.use_critic else _exempt_line(args)), []
    deciding = {_ESTIMATOR, *(row.dest for row in corrections.contract_corrections())}
    adds_correction = [(word.text, why) for _, word, dests in placed.flag_words
                       if (why := _adds(dests, deciding, "a correction flag or --advantage-estimator"))]
    if estimator is not None:
        why = "the estimator decides the verdict (ppo without a correction is refused; the others are exempt)"
        return (f"contract: not determined ({estimator.flag} {estimator.text} is unresolved)",
                [(f"{estimator.flag} {estimator.text}", why)] + adds_correction)
    if contract_error is not None:
        # OPSM alone is refused like no correction: its "old" is the current actor's, so it corrects no staleness
        opsm = ("; --use-opsm is not one: its denominator is the current actor's"
                if getattr(args, "use_opsm", False) else "")
        return f"contract: REJECTED (async PPO without a behavior-policy correction{opsm})", adds_correction
    after = placed.estimator_position
    sets_ppo = [(word.text, why + (" after the last --advantage-estimator" if after is not None else "")
                 + ": ppo is refused without a correction")
                for position, word, dests in placed.flag_words if after is None or position > after
                if (why := _adds(dests, {_ESTIMATOR}, "--advantage-estimator ppo"))]
    return _exempt_line(args), sets_ppo


def _exempt_line(args) -> str:
    return (f"contract: exempt (--advantage-estimator {args.advantage_estimator} trains no critic; upstream "
            "exempts it, though its data is just as stale)")


def check_launch(args: list, driver: str = ASYNC_DRIVER, strict: bool = False) -> Verdict:
    """Check one driver's argument list (words may be ``Unresolved``) without starting anything.

    By default the status is the async contract's verdict: REJECTED when the contract refuses the launch whatever
    the unresolved words hold, DEPENDS when its verdict could change with one, OK otherwise; miles' other
    refusals (pipeline parallelism, a backend it lacks, ...) are reported, not counted. A train.py launch is
    never stale, so its status is OK. With ``strict`` every refusal counts: REJECTED when the driver refuses it
    whatever the unresolved words hold (a train.py launch never depends on them), DEPENDS when a refusal could
    change with an unresolved word.
    """
    verdict, deciding, contract_refused = _strict_verdict(args, driver)
    if driver == SYNC_DRIVER and verdict.status == DEPENDS:
        verdict.status, verdict.depends_on = REJECTED, []  # nothing stale to decide: the refusal stands
    if strict or not verdict.errors or (driver == ASYNC_DRIVER and deciding is None):
        return verdict  # deciding None: the arguments do not parse, so the contract could not be read
    verdict.refusals_counted = False
    if driver == SYNC_DRIVER or not (contract_refused or deciding):
        verdict.status, verdict.depends_on = OK, []
    elif deciding:
        verdict.status, verdict.depends_on = DEPENDS, deciding
    else:
        verdict.status, verdict.depends_on = REJECTED, []
    return verdict


def _strict_verdict(args: list, driver: str) -> tuple:
    """(the verdict counting every refusal, the words the contract's verdict depends on (None: the arguments do
    not parse), whether the contract refuses the launch whatever the unresolved words hold)."""
    parser = _checking_parser()
    add_plugin_arguments(parser, [word for word in args if isinstance(word, str)])  # as the driver: its flags
    placed = _place_unresolved(args, parser)
    lifts = [(word.text, why + ", which could lift the refusal") for _, word, dests in placed.flag_words
             if (why := _adds(dests, set(dests or ()), "any flag"))]
    try:
        namespace, extras = _parse_known(parser, placed.argv)
    except _UsageError as error:
        fix = f"fix: correct that argument (python {driver} --help lists the flags and their values)"
        return Verdict(DEPENDS if lifts else REJECTED, "contract: not checked (the arguments do not parse)",
                       [(f"{driver}: error: {error}", fix)], _unknown_flags(parser, placed.argv), placed.unresolved,
                       lifts), None, False
    for dest, value in placed.unknown_values.items():
        setattr(namespace, dest, value)
    refusal = refusal_line(namespace)  # the driver stops on it first, with argparse's exit status 2
    errors, contract_error, cannot_check = _validation_errors(namespace, driver)
    cannot_check += [f"cannot check: {flag} {text} is refused unless it is {' or '.join(accepts)}, and its value "
                     "is unresolved" for flag, text, accepts in placed.refusal_depends]
    if refusal is not None:
        errors.append((f"{driver}: error: {refusal}", REFUSAL_FIX))
    contract, deciding = _contract(namespace, driver, contract_error, placed)
    if deciding:  # the words it depends on are named below the verdict
        contract = contract.replace("contract:", "contract, from the resolved words alone:", 1)
    other_errors = len(errors) > (contract_error is not None)
    if (contract_error is not None and not deciding) or (other_errors and not lifts):
        status, depends_on = REJECTED, []  # a refusal no unresolved word can lift
    else:
        status, depends_on = (DEPENDS if errors or deciding else OK), deciding or (lifts if errors else [])
    verdict = Verdict(status, contract, errors, _group_flags(extras), placed.unresolved, depends_on, cannot_check)
    return verdict, deciding, contract_error is not None and not deciding
