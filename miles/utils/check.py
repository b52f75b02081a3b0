"""miles-check: find each train_async.py / train.py launch in shell scripts and say whether it would start.

The async off-policy contract (docs/async_off_policy_contract.md) makes ``train_async.py`` refuse async PPO
that has no behavior-policy correction, so launch scripts written before it need one more flag. This checker
finds those scripts without starting anything (no Ray, no model, no file written):

    miles-check -- ARGS...          check ARGS as a train_async.py launch (add --sync: as a train.py launch)
    miles-check SCRIPT.sh [...]     check every train_async.py / train.py invocation in each script

For each invocation it prints file:line and the driver, then one of three results. OK. REJECTED, with the
exact error the driver would print and a one-line fix. UNRESOLVED, with the names it could not resolve. The
arguments go through the real parser (``build_parser``), then ``miles_validate_args``. For train_async.py
they then go through the colocation check and the contract, as in the driver. Each of those
checks runs even when an earlier one failed (within one, the first broken rule is reported). The parser may not know a flag: upstream launchers carry Megatron and SGLang
options. Such flags are listed as ignored. The contract does not read them, so its verdict stands. (miles'
own drivers refuse unknown flags. The checker only ignores them because it reads upstream-style launchers.)

What the script reader resolves without running anything:
- continuation lines, quotes and comments;
- ``;``, ``&&`` and ``|`` lists, redirections, and heredoc bodies (which it skips);
- ``ray job submit ... -- python3 .../train_async.py``;
- variables and bash arrays assigned earlier in the same file: ``LR=1e-6``, ``export``, ``declare -a``,
  ``ARGS=( ... )`` and ``ARGS+=( ... )``, used as ``$LR``, ``${LR}``, ``"${ARGS[@]}"``, ``${ARGS[*]}``,
  ``${ARGS[0]}``, ``${LR:-default}``, ``${LR-default}`` or ``${ARGS[@]+"${ARGS[@]}"}``;
- invocations inside ``if``/``for`` blocks and functions (each found invocation is checked).
``"$@"`` and ``$*`` (the script's own arguments) count as empty, so a script is checked as if it ran with no
arguments.

What it never guesses:
- a variable that is not assigned in the file (it would come from the environment or a sourced file);
- a variable assigned under a condition (in an ``if``/``case``/loop block or a function, or after ``&&``
  / ``||``): conditions are not evaluated;
- a positional parameter ``$1``;
- command substitution ``$(...)`` or backticks, arithmetic, and other ``${...}`` forms;
- Python launchers: a ``python`` command that names a driver without running it, or a driver started
  through ``bash -c`` or ``eval``.
An invocation that needs one of these is UNRESOLVED, and the report names the variable or the command. Its
resolved arguments are still checked and the result is shown. A flag whose value is unresolved stays at its
default.

Exit status: 0 when every invocation is OK. 1 when any invocation is REJECTED or UNRESOLVED, or when a script
has no invocation at all. An unresolved launch is not known to be OK, so it does not pass. 2 for a usage
error: no arguments, --sync together with scripts, or a file that cannot be read.

Limits (bash features it does not model):
- ``#`` in the middle of a word: shlex reads it as a comment;
- interpreter options that take a value (``python -X dev train.py``);
- ``"$@"`` inside a shell function: it is empty as well.
"""

import argparse
import io
import os
import re
import shlex
import sys
from contextlib import redirect_stdout
from dataclasses import dataclass, field

from miles.utils.arguments import (
    build_parser,
    check_async_colocation,
    check_async_max_weight_staleness,
    miles_validate_args,
    validate_async_off_policy_correction,
)
from miles.utils.errors import AsyncOffPolicyCorrectionError, MilesConfigError

ASYNC_DRIVER = "train_async.py"
SYNC_DRIVER = "train.py"
DRIVERS = (ASYNC_DRIVER, SYNC_DRIVER)
OK, REJECTED, UNRESOLVED = "OK", "REJECTED", "UNRESOLVED"
CONTRACT_FIX = (
    "fix: add --keep-old-actor (or --use-rollout-logprobs, or --use-tis) to the train_async.py arguments, "
    "or train synchronously with train.py"
)
_CORRECTIONS = (("use_rollout_logprobs", "--use-rollout-logprobs"), ("use_tis", "--use-tis"),
                ("keep_old_actor", "--keep-old-actor"))

_MARKER = re.compile("\x00(\\d+)\x00")  # an expansion's place in a command, as annotate_expansions leaves it
_SIMPLE_PARAMETER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!]")
_VARIABLE_FORM = re.compile(
    r"\$(?P<plain>[A-Za-z_]\w*)"
    r"|\$\{(?P<name>[A-Za-z_]\w*)(?:\[(?P<index>[@*]|\d+)\])?(?:(?P<operator>:?[-+])(?P<word>.*))?\}"
)
_SCRIPT_ARGUMENTS = re.compile(r"\$\{?[@*]\}?")
_POSITIONAL = re.compile(r"\$\{?\d+\}?")
_OPERATOR_CHARS = frozenset("();<>|&")
_OPERATOR = re.compile(r"&&|\|\||;;|\|&|>>|>&|&>|<<<|<<|<>|[;&|()<>]")
_SEPARATORS = frozenset({";", ";;", "&&", "||", "|", "|&", "&"})
_KEYWORDS = frozenset({"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for", "case", "esac",
                       "select", "!", "{", "}", "time", "exec", "nohup", "command"})
_BLOCK_OPENERS = frozenset({"if", "case", "for", "while", "until", "select", "{"})
_BLOCK_CLOSERS = frozenset({"fi", "esac", "done", "}"})
_DECLARATIONS = frozenset({"export", "declare", "local", "readonly", "typeset"})
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)", re.DOTALL)
_INTERPRETER = re.compile(r"python[0-9.]*")
_INTERPRETER_VARIABLE = re.compile(r"\$\{?\w*PYTHON\w*\}?", re.IGNORECASE)
_SHELL_STRING_RUNNERS = frozenset({"bash", "sh", "eval"})
_MENTIONS_DRIVER = re.compile(r"\btrain(_async)?\.py\b")
_FD_REDIRECTION = re.compile(r"\d+[<>]")


@dataclass(frozen=True)
class Unresolved:
    """A word whose value the script does not determine; ``text`` is the shell text as written."""

    text: str
    reason: str


Word = str | Unresolved


@dataclass(frozen=True)
class Expansion:
    text: str  # e.g. "${PPO_ARGS[@]}", "$LR", "$(pwd)"
    quoted: bool  # inside double quotes: no word splitting


@dataclass
class Invocation:
    line: int
    driver: str  # ASYNC_DRIVER or SYNC_DRIVER
    args: list[Word]  # the words after the driver's path
    uses_script_arguments: bool = False  # "$@" / $* among the command's words (checked as empty)


@dataclass
class LauncherFinding:
    """A command that names a driver but launches it in a way miles-check cannot see into."""

    line: int
    command: str
    reason: str


@dataclass
class ScriptScan:
    invocations: list[Invocation] = field(default_factory=list)
    launchers: list[LauncherFinding] = field(default_factory=list)
    python_commands: list[str] = field(default_factory=list)  # "line N: python3 ..." that run no driver


@dataclass
class Verdict:
    status: str  # OK, REJECTED or UNRESOLVED
    contract: str  # one line: the contract's verdict on its own
    errors: list[tuple[str, str]] = field(default_factory=list)  # (exact message, "fix: ..." line)
    ignored: list[str] = field(default_factory=list)  # flags the parser does not know, with their values
    unresolved: list[str] = field(default_factory=list)  # "--lr ${LR}: why", one per unresolved word


# ---------------------------------------------------------------- reading a script into commands


def _is_continued(buffer: str, line: str) -> bool:
    """Whether ``line`` ends in a backslash that joins the next line (not one escaped, nor one in a comment)."""
    if (len(line) - len(line.rstrip("\\"))) % 2 == 0:
        return False
    probe = "\x01"  # survives tokenizing unless the backslash sits in a comment, which ends at the newline
    try:
        tokens = _shell_tokens(annotate_expansions(buffer + line[:-1] + probe)[0])
    except ValueError:  # inside a quote: bash joins the lines there too
        return True
    return bool(tokens) and tokens[-1].endswith(probe)


def _shell_tokens(annotated: str) -> list:
    """shlex's words and operator runs (``;``, ``&&``, ``(`` ...) of one annotated command."""
    lexer = shlex.shlex(annotated, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def _is_operator(token: str) -> bool:
    return bool(token) and set(token) <= _OPERATOR_CHARS


def _is_complete(command: str) -> bool:
    """No quote left open and no ``(`` (array, subshell, ``$(``) left unclosed."""
    try:
        tokens = _shell_tokens(annotate_expansions(command)[0])
    except ValueError:  # shlex: "No closing quotation" / "No escaped character"
        return False
    return sum(token.count("(") - token.count(")") for token in tokens if _is_operator(token)) <= 0


def _heredoc_body(command: str, lines: list, next_index: int) -> tuple:
    """Skip a heredoc's body (it is input text, not commands): returns (body, index of the line after it)."""
    tokens = _shell_tokens(annotate_expansions(command)[0])
    operators = [following for token, following in zip(tokens, tokens[1:])
                 if _is_operator(token) and _OPERATOR.findall(token)[-1] == "<<"]
    if not operators:
        return "", next_index
    strip_tabs, delimiter = operators[0].startswith("-"), operators[0].lstrip("-")
    body = []
    for index in range(next_index, len(lines)):
        if (lines[index].lstrip("\t") if strip_tabs else lines[index]) == delimiter:
            return "\n".join(body), index + 1
        body.append(lines[index])
    return "\n".join(body), len(lines)


def logical_commands(text: str) -> list:
    """Group a script's physical lines into shell commands: a list of (first line number, text, heredoc body).

    A backslash at the end of a line joins the next one (bash removes the backslash-newline pair); an open
    quote or ``(`` (a multi-line array or ``$(``) keeps the newline and waits for its close.
    """
    lines = text.splitlines()
    commands, buffer, start, index = [], "", 0, 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not buffer:
            start = index
        if _is_continued(buffer, line):
            buffer += line[:-1]
            continue
        buffer += line
        if not _is_complete(buffer):
            buffer += "\n"
            continue
        body, index = _heredoc_body(buffer, lines, index)
        commands.append((start, buffer, body))
        buffer = ""
    if buffer:
        commands.append((start, buffer, ""))
    return commands


def _matching_close(text: str, open_index: int, opening: str, closing: str):
    """Index just past the bracket that closes ``text[open_index]``, or None when it stays open."""
    depth = 0
    for index in range(open_index, len(text)):
        depth += (text[index] == opening) - (text[index] == closing)
        if depth == 0:
            return index + 1
    return None


def _expansion_end(text: str, start: int):
    """Index just past the expansion starting at ``text[start]`` (``$`` or a backtick); None if it is literal."""
    if text[start] == "`":
        end = text.find("`", start + 1)
        return None if end < 0 else end + 1
    following = text[start + 1:start + 2]
    if following == "(":
        return _matching_close(text, start + 1, "(", ")")
    if following == "{":
        return _matching_close(text, start + 1, "{", "}")
    match = _SIMPLE_PARAMETER.match(text, start + 1)
    return match.end() if match else None


def annotate_expansions(command: str) -> tuple:
    """Replace each expansion outside single quotes and comments with a NUL-index-NUL marker.

    shlex splits words and removes quotes but knows nothing of ``$``. This pass keeps each expansion's
    text and whether it was inside double quotes (that decides word splitting), so the words shlex returns
    can be resolved later against the variables assigned up to that command. It also drops the fd digits of
    ``2>``-style redirections, which shlex would otherwise return as a word. Returns (text, expansions).
    """
    out, expansions, quote, index = [], [], "", 0
    while index < len(command):
        char = command[index]
        at_word_start = index == 0 or command[index - 1].isspace() or command[index - 1] in _OPERATOR_CHARS
        end = None
        if quote == "'":
            quote = "" if char == "'" else quote
        elif char == "\\":
            out.append(command[index:index + 2])
            index += 2
            continue
        elif char == '"' or (char == "'" and not quote):
            quote = "" if quote == char else char
        elif not quote and char == "#" and at_word_start:
            end = command.find("\n", index)
            end = len(command) if end < 0 else end
            out.append(command[index:end])  # the comment, left for shlex to drop
        elif not quote and at_word_start and _FD_REDIRECTION.match(command, index):
            end = _FD_REDIRECTION.match(command, index).end() - 1  # keep only the > or <
        elif char in "$`":
            end = _expansion_end(command, index)
            if end is not None:
                expansions.append(Expansion(command[index:end], quoted=quote == '"'))
                out.append(f"\x00{len(expansions) - 1}\x00")
        if end is None:
            out.append(char)
            index += 1
        else:
            index = end
    return "".join(out), expansions


def _simple_commands(tokens: list) -> list:
    """Split a command's tokens at ``;``/``&&``/``||``/``|``/``&``; drop redirections with their targets.

    Returns (words, conditional) pairs; ``conditional`` marks a command that runs only if the one before it
    succeeded or failed (after ``&&`` / ``||``).
    """
    commands, current, skip_next, conditional = [], [], False, False
    pieces = [piece for token in tokens
              for piece in (_OPERATOR.findall(token) if _is_operator(token) else [token])]
    for piece in pieces:
        if skip_next:
            skip_next = False
        elif piece in _SEPARATORS:
            commands.append((current, conditional))
            current, conditional = [], piece in ("&&", "||") or (conditional and piece in ("|", "|&"))
        elif piece in ("(", ")") or not _OPERATOR.fullmatch(piece):
            current.append(piece)
        else:  # a redirection operator: its target word is not an argument
            skip_next = True
    commands.append((current, conditional))
    return [(words, conditional) for words, conditional in commands if words]


# ---------------------------------------------------------------- resolving words


def _unsupported_reason(text: str) -> str:
    if text.startswith("$(("):
        return "arithmetic expansion is not evaluated"
    if text.startswith(("$(", "`")):
        return "command substitution: miles-check runs no commands"
    if _POSITIONAL.fullmatch(text):
        return "a positional parameter of the script, which has no value when the script is checked alone"
    return "this form of parameter expansion is not evaluated"


def _text(word) -> str:
    return word.text if isinstance(word, Unresolved) else word


def _unassigned(text: str, name: str, operator, word: str) -> Unresolved:
    reason = (f"{name} is not assigned in this script before this line (it would come from the environment or "
              "a sourced file")
    if operator in ("-", ":-"):
        reason += f", or be {word!r} when unset"
    return Unresolved(text, reason + ")")


def _expand_word(word: str, variables: dict, text: str) -> list:
    """The words of the ``word`` in ``${X:-word}`` / ``${X+word}``, itself a small piece of shell."""
    annotated, expansions = annotate_expansions(word)
    try:
        raw_words = shlex.split(annotated)
    except ValueError:
        return [Unresolved(text, "the word inside this expansion cannot be read")]
    return [value for raw in raw_words for value in resolve_words(raw, expansions, variables)]


def _split_or_join(values: list, expansion: Expansion) -> list[Word]:
    """Bash word splitting: unquoted values split on whitespace (an empty one vanishes), a quoted
    ``"${A[@]}"`` keeps one word per element, any other quoted expansion is one word."""
    if not expansion.quoted:
        return [piece for value in values for piece in ([value] if isinstance(value, Unresolved) else value.split())]
    if expansion.text.endswith("[@]}") or len(values) <= 1:
        return values
    unresolved = [value for value in values if isinstance(value, Unresolved)]
    return [Unresolved(expansion.text, unresolved[0].reason)] if unresolved else [" ".join(values)]


def expand(expansion: Expansion, variables: dict) -> list[Word]:
    """The words one expansion yields where it is a whole word, given the variables assigned so far.

    ``variables`` maps a name to its list of values (a scalar is a list of one). A name the script has not
    assigned is never guessed: it yields one ``Unresolved`` naming it. ``${X-w}``, ``${X:-w}``, ``${X+w}``
    and ``${X:+w}`` follow bash: "set" means assigned (an array: with at least one element), ``:`` also
    treats an empty value as unset.
    """
    text = expansion.text
    if _SCRIPT_ARGUMENTS.fullmatch(text):
        return []
    match = _VARIABLE_FORM.fullmatch(text)
    if match is None:
        return [Unresolved(text, _unsupported_reason(text))]
    name, operator, word = match["plain"] or match["name"], match["operator"], match["word"]
    if name not in variables:
        return [_unassigned(text, name, operator, word)]
    values, index = variables[name], match["index"]
    if index in ("@", "*"):
        selected = list(values)
    else:
        position = int(index or 0)
        selected = values[position:position + 1]
    is_set = bool(selected) and not (operator and operator.startswith(":") and all(v == "" for v in selected))
    use_word = is_set if operator in ("+", ":+") else (operator in ("-", ":-") and not is_set)
    if use_word:  # its words are split already, by the word's own quoting
        words = _expand_word(word, variables, text)
        return _split_or_join(words, expansion) if expansion.quoted else words
    if operator in ("+", ":+"):
        return []
    selected = selected or ([] if index in ("@", "*") else [""])
    return _split_or_join([_through_variable(name, value, text) for value in selected], expansion)


def _through_variable(name: str, value: Word, text: str) -> Word:
    """A value read through ``text`` (e.g. ``$LR``); an unresolved one says where the variable got it."""
    if not isinstance(value, Unresolved) or value.text in (f"${name}", f"${{{name}[@]}}"):
        return value
    return Unresolved(text, f"{name}={value.text}: {value.reason}")


def _display(raw: str, expansions: list) -> str:
    return _MARKER.sub(lambda match: expansions[int(match.group(1))].text, raw)


def resolve_words(raw: str, expansions: list, variables: dict, split: bool = True) -> list:
    """The words one shlex word becomes once its expansions are resolved (bash semantics, simplified).

    A word that is exactly one expansion yields the words ``expand`` gives. An expansion inside a longer word
    joins its words with spaces. With ``split=False`` (an assignment's value) the result is one word. A word
    that depends on anything unresolved becomes one ``Unresolved``.
    """
    parts = _MARKER.split(raw)  # literal, index, literal, index, ..., literal
    if len(parts) == 1:
        return [raw]
    if split and len(parts) == 3 and parts[0] == parts[2] == "":
        return expand(expansions[int(parts[1])], variables)
    pieces = []
    for position, part in enumerate(parts):
        if position % 2 == 0:
            pieces.append(part)
            continue
        values = expand(expansions[int(part)], variables)
        unresolved = [value for value in values if isinstance(value, Unresolved)]
        if unresolved:
            return [Unresolved(_display(raw, expansions), unresolved[0].reason)]
        pieces.append(" ".join(values))
    return ["".join(pieces)]


def _is_interpreter(word) -> bool:
    if isinstance(word, Unresolved):
        return bool(_INTERPRETER_VARIABLE.fullmatch(word.text))
    return bool(_INTERPRETER.fullmatch(os.path.basename(word)))


def driver_position(words: list):
    """Index of the word that is the driver in a python command, or None when the command runs no driver.

    The driver's path must be the command itself (``./train_async.py``) or follow a python interpreter with
    only interpreter options between them (``python3 -u train.py``); ``ray job submit ... -- python3
    /path/train_async.py`` qualifies. A word like ``cp train.py backup/`` does not.
    """
    for position, word in enumerate(words):
        if os.path.basename(_text(word)) not in DRIVERS:
            continue
        if position == 0:
            return position
        for before in reversed(words[:position]):
            if _is_interpreter(before):
                return position
            if not _text(before).startswith("-"):
                break
    return None


# ---------------------------------------------------------------- walking a script


def _conditional_reason(name: str, line: int) -> str:
    return f"{name} is assigned under a condition at line {line}, which miles-check does not evaluate"


class ScriptReader:
    """Walks a script's commands in order, keeping the variables and arrays assigned so far."""

    def __init__(self):
        self.variables: dict[str, list[Word]] = {}  # a scalar is a list of one value
        self.block_depth = 0  # inside if/case/for/while/{ } (function bodies too): assignments are conditional
        self.scan = ScriptScan()

    def read(self, text: str) -> ScriptScan:
        for line, command, heredoc in logical_commands(text):
            annotated, expansions = annotate_expansions(command)
            try:
                tokens = _shell_tokens(annotated)
            except ValueError as error:  # a quote still open at the end of the file
                if _MENTIONS_DRIVER.search(command):
                    self.scan.launchers.append(LauncherFinding(line, command[:80], f"cannot be read: {error}"))
                continue
            for words, after_and_or in _simple_commands(tokens):
                words = self._enter_and_leave_blocks(words)
                self._command(line, words, expansions, heredoc, after_and_or or self.block_depth > 0)
        return self.scan

    def _enter_and_leave_blocks(self, words: list) -> list:
        """Count the blocks a command opens and closes; returns its words without the leading keywords."""
        leading = 0
        while leading < len(words) and words[leading] in _KEYWORDS:
            leading += 1
        for position, word in enumerate(words):  # `f() {` opens a function body after other words
            if position < leading or word in ("{", "}"):
                self.block_depth += (word in _BLOCK_OPENERS) - (word in _BLOCK_CLOSERS)
        self.block_depth = max(self.block_depth, 0)
        return words[leading:]

    def _command(self, line: int, words: list, expansions: list, heredoc: str, conditional: bool) -> None:
        """One simple command: an assignment updates the variables, a driver invocation is recorded.

        An assignment that runs only under a condition (in a block, after ``&&``/``||``) makes the variable
        unresolved: miles-check does not evaluate conditions.
        """
        condition_line = line if conditional else None
        declared = bool(words) and words[0] in _DECLARATIONS
        if declared:  # drop the keyword and its options (declare -a, export -n ...)
            words = words[1:]
            while words and words[0].startswith("-"):
                words = words[1:]
        if len(words) >= 2 and words[1] == "(" and _ASSIGNMENT.fullmatch(words[0]) and words[0].endswith("="):
            self._assign_array(words, expansions, condition_line)
            return
        assignments = 0
        while assignments < len(words) and _ASSIGNMENT.fullmatch(words[assignments]):
            assignments += 1
        rest = [word for word in words[assignments:] if word not in ("(", ")")]
        if declared or not rest:  # a command-prefix assignment (X=1 cmd) only sets cmd's environment
            for word in words[:assignments]:
                self._assign(word, expansions, condition_line)
            return
        resolved = [value for word in rest for value in resolve_words(word, expansions, self.variables)]
        self._record(line, resolved, rest, expansions, heredoc)

    def _assign(self, word: str, expansions: list, condition_line) -> None:
        name, append, raw_value = _ASSIGNMENT.fullmatch(word).groups()
        value = resolve_words(raw_value, expansions, self.variables, split=False)[0]
        if condition_line is not None:
            value = Unresolved(f"${name}", _conditional_reason(name, condition_line))
        previous = self.variables.get(name, [""]) if append else [""]
        if append and isinstance(previous[0], str) and isinstance(value, str):
            value = previous[0] + value
        self.variables[name] = [value]

    def _assign_array(self, words: list, expansions: list, condition_line) -> None:
        name, append, _ = _ASSIGNMENT.fullmatch(words[0]).groups()
        close = words.index(")", 2) if ")" in words[2:] else len(words)
        elements = [value for word in words[2:close]
                    for value in resolve_words(word, expansions, self.variables)]
        if condition_line is not None:
            elements = [Unresolved(f"${{{name}[@]}}", _conditional_reason(name, condition_line))]
        self.variables[name] = (self.variables.get(name, []) if append else []) + elements

    def _record(self, line: int, resolved: list, raw: list, expansions: list, heredoc: str) -> None:
        position = driver_position(resolved)
        if not resolved:
            return
        if position is not None:
            uses_script_arguments = any(
                _SCRIPT_ARGUMENTS.fullmatch(expansions[int(index)].text)
                for word in raw for index in _MARKER.findall(word)
            )
            driver = os.path.basename(_text(resolved[position]))
            self.scan.invocations.append(Invocation(line, driver, resolved[position + 1:], uses_script_arguments))
            return
        shown = " ".join(_text(word) for word in resolved)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        runs_python = any(_is_interpreter(word) for word in resolved)
        if runs_python:
            self.scan.python_commands.append(f"line {line}: {shown}")
        if not _MENTIONS_DRIVER.search(" ".join(_text(word) for word in resolved) + "\n" + heredoc):
            return
        if runs_python:
            reason = "a Python launcher: miles-check cannot see the arguments it passes to the driver"
        elif _text(resolved[0]) in _SHELL_STRING_RUNNERS:
            reason = f"the driver is launched through `{_text(resolved[0])}`, whose string miles-check does not run"
        else:
            return
        self.scan.launchers.append(LauncherFinding(line, shown, reason))


def scan_script(text: str) -> ScriptScan:
    """Every driver invocation in a script (with its resolved arguments) and every launch it cannot see into."""
    return ScriptReader().read(text)


# ---------------------------------------------------------------- checking one argument list


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


def _takes_value(parser: argparse.ArgumentParser, flag: str) -> bool:
    """Whether the parser reads a value after ``flag`` (an unknown flag: no, its value is ignored anyway)."""
    probe = "\x00probe"
    try:
        _, extras = _parse_known(parser, [flag, probe])
    except _UsageError:  # it tried to read the probe as its value (and rejected it)
        return True
    return probe not in extras


def _without_unresolved(args: list, parser: argparse.ArgumentParser) -> tuple:
    """Leave out unresolved words; a known flag whose value is unresolved is left out too (it keeps its default).

    Returns (argv of the resolved words, one display line per unresolved word).
    """
    argv, unresolved = [], []
    for word in args:
        if not isinstance(word, Unresolved):
            argv.append(word)
            continue
        shown = word.text
        if argv and argv[-1].startswith("-") and "=" not in argv[-1] and _takes_value(parser, argv[-1]):
            shown = f"{argv.pop()} {word.text}"
        unresolved.append(f"{shown}: {word.reason}")
    return argv, unresolved


def _group_flags(extras: list) -> list:
    """["--tp", "2", "--sp"] -> ["--tp 2", "--sp"]: each unknown flag with the values that follow it."""
    groups = []
    for token in extras:
        if token.startswith("-") and not re.fullmatch(r"-\d[\d.e+-]*", token) or not groups:
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


def _contract_line(args, driver: str, contract_error) -> str:
    if driver == SYNC_DRIVER:
        return "contract: not applicable (train.py is synchronous, never stale)"
    if not hasattr(args, "use_critic"):
        return "contract: not determined (the validation stopped before deriving use_critic)"
    if contract_error is not None:
        return "contract: REJECTED (async PPO without a behavior-policy correction)"
    if not args.use_critic:
        return (f"contract: exempt (--advantage-estimator {args.advantage_estimator} trains no critic; upstream "
                "exempts it, though its data is just as stale)")
    chosen = [flag for attribute, flag in _CORRECTIONS if getattr(args, attribute)]
    return f"contract: OK ({', '.join(chosen)})"


def _validation_errors(args, driver: str) -> tuple:
    """Run the checks the driver runs, each one even when an earlier one failed: (errors, contract error)."""
    errors, contract_error = [], None
    checks = [miles_validate_args]
    if driver == ASYNC_DRIVER:
        checks += [check_async_colocation, validate_async_off_policy_correction, check_async_max_weight_staleness]
    for check in checks:
        if check is validate_async_off_policy_correction and not hasattr(args, "use_critic"):
            break  # reported as "not determined" by _contract_line
        try:
            check(args)
        except MilesConfigError as error:
            errors.append((str(error), _fix_line(error)))
            if isinstance(error, AsyncOffPolicyCorrectionError):
                contract_error = error
    return errors, contract_error


def check_launch(args: list, driver: str = ASYNC_DRIVER) -> Verdict:
    """Check one driver's argument list (words may be ``Unresolved``) without starting anything."""
    parser = _checking_parser()
    argv, unresolved = _without_unresolved(args, parser)
    try:
        namespace, extras = _parse_known(parser, argv)
    except _UsageError as error:
        fix = f"fix: correct that argument (python {driver} --help lists the flags and their values)"
        return Verdict(UNRESOLVED if unresolved else REJECTED, "contract: not checked (the arguments do not parse)",
                       [(f"{driver}: error: {error}", fix)], [], unresolved)
    errors, contract_error = _validation_errors(namespace, driver)
    contract = _contract_line(namespace, driver, contract_error)
    if unresolved:  # the unresolved words may change the verdict: say what it rests on
        contract = contract.replace("contract:", "contract, from the resolved words alone:", 1)
    status = UNRESOLVED if unresolved else (REJECTED if errors else OK)
    return Verdict(status, contract, errors, _group_flags(extras), unresolved)


# ---------------------------------------------------------------- reporting


def format_verdict(location: str, driver: str, verdict: Verdict, uses_script_arguments: bool = False) -> list:
    """The report lines of one invocation: a header, then indented details."""
    lines = [f"{location}: {driver}: {verdict.status}; {verdict.contract}"]
    for entry in verdict.unresolved:
        lines.append(f"  unresolved (not guessed): {entry}")
    if verdict.unresolved and verdict.errors:
        lines.append("  the resolved words alone are rejected:")
    for message, fix in verdict.errors:
        lines += ["  " + line for line in f"error: {message}".splitlines()]
        lines.append(f"  {fix}")
    if verdict.ignored:
        lines.append("  ignored (unknown to the miles parser; the contract does not read them): "
                     + ", ".join(verdict.ignored))
    if uses_script_arguments:
        lines.append('  note: "$@" (the script\'s own arguments) is checked as empty')
    return lines


def _report_script(path: str, scan: ScriptScan) -> list:
    """Print one script's results; returns the statuses it counts toward the exit code."""
    statuses = []
    for invocation in scan.invocations:
        verdict = check_launch(invocation.args, invocation.driver)
        for line in format_verdict(f"{path}:{invocation.line}", invocation.driver, verdict,
                                   invocation.uses_script_arguments):
            print(line)
        statuses.append(verdict.status)
    for launcher in scan.launchers:
        print(f"{path}:{launcher.line}: {UNRESOLVED}: {launcher.command}\n  unresolved (not guessed): {launcher.reason}")
        statuses.append(UNRESOLVED)
    if not statuses:
        print(f"{path}: no train_async.py / train.py invocation found (not OK: nothing was checked)")
        for command in scan.python_commands:
            print(f"  python command seen, not a driver: {command}")
        statuses.append("NO INVOCATION")
    return statuses


def _summary(statuses: list, files: int) -> str:
    counts = {status: statuses.count(status) for status in dict.fromkeys(statuses)}
    shown = ", ".join(f"{count} {status}" for status, count in counts.items())
    return f"miles-check: {len(statuses)} result(s) in {files} file(s): {shown}"


def _build_cli() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="miles-check",
        usage="miles-check [--sync] -- ARGS...  |  miles-check SCRIPT.sh [SCRIPT.sh ...]",
        description="Check train_async.py / train.py launches against miles' parser, its rules and the async "
        "off-policy contract, without starting anything.",
        epilog="Exit status: 0 every invocation OK; 1 any REJECTED or UNRESOLVED (a $VAR from the environment, "
        "a sourced file or a condition, $(...), a Python launcher: reported, never guessed, and not OK), or a "
        "script without "
        "an invocation; 2 usage error. Flags the parser does not know (Megatron/SGLang) are listed as "
        'ignored. "$@" in a script counts as empty. Details: the docstring of miles/utils/check.py and '
        "docs/async_off_policy_contract.md.",
    )
    parser.add_argument("scripts", nargs="*", metavar="SCRIPT.sh", help="Shell scripts to scan for launches.")
    parser.add_argument("--sync", action="store_true", help="With `-- ARGS`: check them as a train.py launch.")
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


def main(argv=None) -> int:
    """The ``miles-check`` console script; returns the exit status (0 OK, 1 not OK, 2 usage error)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    own, launch_args = argv[:split], (argv[split + 1:] if split < len(argv) else None)
    parser = _build_cli()
    try:
        options = parser.parse_args(own)
        if launch_args is None and not options.scripts:
            parser.error("give `-- ARGS...` to check one launch, or SCRIPT.sh files to scan")
        if launch_args is not None and options.scripts:
            parser.error("give either `-- ARGS...` or SCRIPT.sh files, not both")
        if options.sync and launch_args is None:
            parser.error("--sync applies to `-- ARGS...`; a script's driver is read from the script")
        texts = [] if launch_args is not None else _read_scripts(parser, options.scripts)
    except SystemExit as exit_request:  # argparse's usage errors (2) and --help (0)
        return exit_request.code if isinstance(exit_request.code, int) else 2
    if launch_args is not None:
        driver = SYNC_DRIVER if options.sync else ASYNC_DRIVER
        verdict = check_launch(launch_args, driver)
        print("\n".join(format_verdict("command line", driver, verdict)))
        return 0 if verdict.status == OK else 1
    statuses = [status for path, text in zip(options.scripts, texts, strict=True)
                for status in _report_script(path, scan_script(text))]
    print(_summary(statuses, len(texts)))
    return 0 if all(status == OK for status in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
