"""Walking a launch script in order: the variables it assigns, the files it sources, the launches it runs.

Conditions are never evaluated: an assignment that runs only under one makes its variable unresolved.
"""

import dataclasses
import os
import re
from dataclasses import dataclass, field

from miles.check.shell import (
    _MARKER,
    _SCRIPT_ARGUMENTS,
    Unresolved,
    Word,
    _display,
    _is_interpreter,
    _shell_tokens,
    _text,
    annotate_expansions,
    driver_position,
    logical_commands,
    resolve_words,
    simple_commands,
)

_KEYWORDS = frozenset({"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for", "case", "esac",
                       "select", "!", "{", "}", "time", "exec", "nohup", "command"})
_BLOCK_OPENERS = frozenset({"if", "case", "for", "while", "until", "select", "{"})
_BLOCK_CLOSERS = frozenset({"fi", "esac", "done", "}"})
_DECLARATIONS = frozenset({"export", "declare", "local", "readonly", "typeset"})
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)", re.DOTALL)
_EVAL_ASSIGNMENT = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\+?=(\()?")
_SHELL_STRING_RUNNERS = frozenset({"bash", "sh", "eval"})
_MENTIONS_DRIVER = re.compile(r"\btrain(_async)?\.py\b")
_OPTIONS_WITH_VALUES = {"read": "adinNptu", "mapfile": "dnOsuCc", "readarray": "dnOsuCc"}
MAX_SOURCE_DEPTH = 8  # `source` nesting followed; deeper (or a cycle) is reported, not read


@dataclass
class Invocation:
    line: int
    driver: str  # ASYNC_DRIVER or SYNC_DRIVER
    args: list[Word]  # the words after the driver's path
    uses_script_arguments: bool = False  # "$@" / $* among the command's words (checked as empty)
    file: str | None = None  # the sourced file it is in; None: the script itself


@dataclass
class LauncherFinding:
    """A command that names a driver but launches it in a way miles-check cannot see into."""

    line: int
    command: str
    reason: str
    file: str | None = None


@dataclass
class ScriptScan:
    invocations: list[Invocation] = field(default_factory=list)
    launchers: list[LauncherFinding] = field(default_factory=list)
    python_commands: list[str] = field(default_factory=list)  # "line N: python3 ..." that run no driver


class ScriptVariables(dict):
    """Name -> list of values (a scalar is a list of one), plus the ``source``s that could not be followed,
    which the report of an unassigned name mentions as where it could come from."""

    def __init__(self):
        super().__init__()
        self.unread_sources: list[str] = []


def _conditional_reason(name: str, where: str) -> str:
    return (f"{name} is assigned under a condition at {where}, which miles-check does not evaluate (it holds "
            "the words assigned there or the ones it had before)")


def _options_and_operands(words: list, with_values: str) -> tuple:
    """getopt for builtins: ``-ra NAME`` -> ({"r": True, "a": "NAME"}, operands)."""
    options, index = {}, 0
    while index < len(words) and words[index].startswith("-") and words[index] != "--":
        cluster = words[index][1:]
        index += 1
        for position, letter in enumerate(cluster):
            if letter in with_values:
                attached = cluster[position + 1:]
                options[letter] = attached or (words[index] if index < len(words) else "")
                index += 0 if attached else 1
                break
            options[letter] = True
    index += index < len(words) and words[index] == "--"
    return options, words[index:]


class ScriptReader:
    """Walks a script's commands in order, keeping the variables and arrays assigned so far.

    ``path`` (when known) gives ``$0`` and ``${BASH_SOURCE[0]}``, so the script's folder resolves, and lets
    ``source`` follow files named by absolute paths (``"${SCRIPT_DIR}/common.sh"``).
    """

    def __init__(self, path: str | None = None):
        self.variables = ScriptVariables()
        self.block_depth = 0  # inside if/case/for/while/{ } (function bodies too): assignments are conditional
        self.enclosing_condition = None  # where a conditional `source` / `eval` whose text is being read runs
        self.file = None  # the sourced file being read; None: the script itself
        self.reading = []  # real paths of the files being read, to refuse a `source` cycle
        self.path = path
        if path is not None:
            self.variables["0"] = [os.path.abspath(path)]
            self.reading.append(os.path.realpath(path))
        self.scan = ScriptScan()

    def read(self, text: str) -> ScriptScan:
        self._walk(text)
        return self.scan

    def _where(self, line: int) -> str:
        return f"line {line}" if self.file is None else f"{os.path.basename(self.file)}:{line}"

    def _walk(self, text: str, eval_line: int | None = None) -> None:
        """Read ``text``'s commands; the commands of an eval'd string are all at the eval's line."""
        saved_source = self.variables.get("BASH_SOURCE")
        current = self.file if self.file is not None else self.path
        if current is not None:
            self.variables["BASH_SOURCE"] = [os.path.abspath(current)]
        for line, command, heredoc in logical_commands(text):
            line = eval_line or line
            annotated, expansions = annotate_expansions(command)
            try:
                tokens = _shell_tokens(annotated)
            except ValueError as error:  # a quote still open at the end of the file
                if _MENTIONS_DRIVER.search(command):
                    finding = LauncherFinding(line, command[:80], f"cannot be read: {error}", self.file)
                    self.scan.launchers.append(finding)
                continue
            for simple in simple_commands(tokens):
                words = self._enter_and_leave_blocks(simple.words)
                conditional = simple.conditional or self.block_depth > 0
                self._command(line, words, expansions, heredoc, simple, conditional)
        if saved_source is not None:
            self.variables["BASH_SOURCE"] = saved_source

    def _nested(self, text: str, condition_line, file=None, eval_line=None) -> None:
        """Read a sourced file or an eval'd string in place; all of it is conditional if its command was."""
        saved = self.block_depth, self.enclosing_condition, self.file
        self.block_depth, self.enclosing_condition = 0, condition_line
        self.file = file if file is not None else self.file
        self._walk(text, eval_line)
        self.block_depth, self.enclosing_condition, self.file = saved

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

    def _command(self, line, words, expansions, heredoc, simple, conditional) -> None:
        """One simple command: an assignment updates the variables, a driver invocation is recorded.

        An assignment that runs only under a condition (in a block, after ``&&``/``||``) makes the variable
        unresolved: miles-check does not evaluate conditions.
        """
        condition = self._where(line) if conditional else self.enclosing_condition
        declared = bool(words) and words[0] in _DECLARATIONS
        if declared:  # drop the keyword and its options (declare -a, export -n ...)
            words = words[1:]
            while words and words[0].startswith("-"):
                words = words[1:]
        if len(words) >= 2 and words[1] == "(" and _ASSIGNMENT.fullmatch(words[0]) and words[0].endswith("="):
            self._assign_array(words, expansions, condition)
            return
        assignments = 0
        while assignments < len(words) and _ASSIGNMENT.fullmatch(words[assignments]):
            assignments += 1
        rest = [word for word in words[assignments:] if word not in ("(", ")")]
        if declared or not rest:  # a command-prefix assignment (X=1 cmd) only sets cmd's environment
            for word in words[:assignments]:
                self._assign(word, expansions, condition)
            return
        if rest[0] in _OPTIONS_WITH_VALUES:  # its words from the command name on (a subshell's "(" dropped)
            self._read_into(line, words[words.index(rest[0]):], expansions, simple, condition)
        elif rest[0] in ("source", ".") and len(words) > words.index(rest[0]) + 1:
            self._source(line, words[words.index(rest[0]) + 1], expansions, condition)
        elif not (rest[0] == "eval" and self._eval(line, rest[1:], expansions, condition)):
            resolved = [value for word in rest for value in resolve_words(word, expansions, self.variables)]
            self._record(line, resolved, rest, expansions, heredoc)

    def _store(self, name: str, values: list, condition, array: bool, append: bool = False) -> None:
        """Set a variable. One assigned under a condition is unresolved: it holds the new words or the old ones.

        The old words of a name not assigned before are known for an array (none: bash exports no arrays,
        so the script's own array starts empty) and unknown for a scalar (it may come from the environment).
        """
        previous = self.variables.get(name, [] if array else None)
        if append:
            values = (previous or []) + values
        if condition is not None:
            text = f"${{{name}[@]}}" if array else f"${name}"
            could_hold = None if previous is None else tuple(values) + tuple(previous)
            values = [Unresolved(text, _conditional_reason(name, condition), several=array, could_hold=could_hold)]
        self.variables[name] = values

    def _assign(self, word: str, expansions: list, condition) -> None:
        name, append, raw_value = _ASSIGNMENT.fullmatch(word).groups()
        value = resolve_words(raw_value, expansions, self.variables, split=False)[0]
        previous = self.variables.get(name, [""]) if append else [""]
        if append and isinstance(previous[0], str) and isinstance(value, str):
            value = previous[0] + value
        self._store(name, [value], condition, array=False)

    def _assign_array(self, words: list, expansions: list, condition) -> None:
        name, append, _ = _ASSIGNMENT.fullmatch(words[0]).groups()
        close = words.index(")", 2) if ")" in words[2:] else len(words)
        # an unquoted expansion among the elements is split when assigned: it may be several elements
        elements = [dataclasses.replace(value, several=True) if getattr(value, "unquoted", False) else value
                    for word in words[2:close] for value in resolve_words(word, expansions, self.variables)]
        self._store(name, elements, condition, array=True, append=bool(append))

    def _read_into(self, line: int, words: list, expansions: list, simple, condition) -> None:
        """``read [-r] NAME`` / ``read -a NAME`` / ``mapfile -t NAME``: the words of the here-string, if any."""
        command = words[0]
        options, operands = _options_and_operands(words[1:], _OPTIONS_WITH_VALUES[command])
        array = options.get("a") if command == "read" else (operands[0] if operands else "MAPFILE")
        names = [array] if array else (operands or ["REPLY"])
        if simple.here_string is not None:
            source = resolve_words(simple.here_string, expansions, self.variables, split=False)[0]
        elif simple.input_command is not None:
            shown_command = _display(simple.input_command, expansions)
            source = Unresolved(f"<({shown_command})", "a process substitution: miles-check runs no commands")
        else:
            source = Unresolved("its standard input", "a pipe or a file, which miles-check does not read")
        if isinstance(source, str):
            lines = source.split("\n")
            fields = lines[0].split() if command == "read" else lines
            if array:
                self._store(array, fields, condition, array=True)
            for position, name in enumerate(names if not array else []):  # the last name takes the rest
                rest = lines[0].split(maxsplit=len(names) - 1)
                self._store(name, [rest[position] if position < len(rest) else ""], condition, array=False)
            return
        shown = " ".join([command] + [word for word in words[1:] if word.startswith("-")])
        for name in names:
            reason = f"{name} is assigned at {self._where(line)} by `{shown}` from {source.text}: {source.reason}"
            text = f"${{{name}[@]}}" if array else f"${name}"
            self._store(name, [Unresolved(text, reason, several=bool(array))], condition, array=bool(array))

    def _eval(self, line: int, words: list, expansions: list, condition) -> bool:
        """Read a resolved eval string as commands; an unresolved ``eval "NAME=(...)"`` makes NAME unresolved.

        Returns False when the eval is neither (its string is then checked for a driver launch).
        """
        values = [value for word in words for value in resolve_words(word, expansions, self.variables)]
        unresolved = [value for value in values if isinstance(value, Unresolved)]
        if not unresolved:
            self._nested(" ".join(values), condition, eval_line=line)
            return True
        shown = " ".join(_display(word, expansions) for word in words)
        match = _EVAL_ASSIGNMENT.match(shown)
        if match is None:
            return False
        name, array = match[1], bool(match[2])
        reason = f"{name} is assigned at {self._where(line)} by eval of \"{shown}\": {unresolved[0].reason}"
        text = f"${{{name}[@]}}" if array else f"${name}"
        self._store(name, [Unresolved(text, reason, several=array)], condition, array=array)
        return True

    def _source(self, line: int, word: str, expansions: list, condition) -> None:
        """Follow ``source FILE`` when FILE resolves to a readable file; otherwise say why it is not read."""
        target = resolve_words(word, expansions, self.variables, split=False)[0]
        shown = f"{'<(...)' if word == '(' else _display(word, expansions)}, sourced at {self._where(line)}"
        why_not = self._why_not_readable(target)
        if why_not is None:
            try:
                with open(target, encoding="utf-8", errors="replace") as handle:
                    text = handle.read()
            except OSError as error:
                why_not = error.strerror
        if why_not is not None:
            self.variables.unread_sources.append(f"{shown} and not read ({why_not})")
            return
        self.reading.append(os.path.realpath(target))
        self._nested(text, condition, file=target)
        self.reading.pop()

    def _why_not_readable(self, target: Word):
        if target == "(":
            return "a process substitution: miles-check runs no commands"
        if isinstance(target, Unresolved):
            return target.reason
        if not os.path.isabs(target):
            return "a relative path, which bash looks up from the directory the script is started in"
        if os.path.realpath(target) in self.reading:
            return "it is already being read: a cycle"
        if len(self.reading) > MAX_SOURCE_DEPTH:
            return f"sourced files nest deeper than {MAX_SOURCE_DEPTH}"
        if not os.path.isfile(target):
            return "no such file"
        return None

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
            self.scan.invocations.append(
                Invocation(line, driver, resolved[position + 1:], uses_script_arguments, self.file))
            return
        shown = " ".join(_text(word) for word in resolved)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        runs_python = any(_is_interpreter(word) for word in resolved)
        if runs_python:
            self.scan.python_commands.append(f"{self._where(line)}: {shown}")
        if not _MENTIONS_DRIVER.search(" ".join(_text(word) for word in resolved) + "\n" + heredoc):
            return
        if runs_python:
            reason = "a Python launcher: miles-check cannot see the arguments it passes to the driver"
        elif _text(resolved[0]) in _SHELL_STRING_RUNNERS:
            reason = f"the driver is launched through `{_text(resolved[0])}`, whose string miles-check does not run"
        else:
            return
        self.scan.launchers.append(LauncherFinding(line, shown, reason, self.file))


def scan_script(text: str, path: str | None = None) -> ScriptScan:
    """Every driver invocation in a script (with its resolved arguments) and every launch it cannot see into.

    ``path``: where the script is, for ``$0`` / ``${BASH_SOURCE[0]}`` and ``source`` (None: unknown).
    """
    return ScriptReader(path).read(text)
