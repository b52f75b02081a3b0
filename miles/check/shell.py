"""Reading shell text without running it: commands, words, expansions and their values (bash semantics).

``logical_commands`` groups a script's lines into commands, ``annotate_expansions`` marks each ``$...`` so that
shlex can split words, and ``resolve_words`` gives a word's values against the variables assigned so far. A
value the text does not determine is an ``Unresolved`` that says why. The only commands whose output is known
are the path idioms of ``path_command_output`` (``$(cd "$(dirname "$0")" && pwd)`` and its relatives): they
read no file and their output follows from the script's own path.
"""

import dataclasses
import os
import re
import shlex
from dataclasses import dataclass

ASYNC_DRIVER = "train_async.py"
SYNC_DRIVER = "train.py"
DRIVERS = (ASYNC_DRIVER, SYNC_DRIVER)

_MARKER = re.compile("\x00(\\d+)\x00")  # an expansion's place in a command, as annotate_expansions leaves it
_SIMPLE_PARAMETER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!]")
_VARIABLE_FORM = re.compile(
    r"\$(?P<plain>[A-Za-z_]\w*)"
    r"|\$\{(?P<name>[A-Za-z_]\w*)(?:\[(?P<index>[@*]|\d+)\])?(?:(?P<operator>:?[-+])(?P<word>.*))?\}"
)
_SCRIPT_ARGUMENTS = re.compile(r"\$\{?[@*]\}?")
_POSITIONAL = re.compile(r"\$\{?\d+\}?")
_SCRIPT_PATH = re.compile(r"\$\{?0\}?")  # $0: the script's own path
_OPERATOR_CHARS = frozenset("();<>|&")
_OPERATOR = re.compile(r"&&|\|\||;;|\|&|>>|>&|&>|<<<|<<|<>|[;&|()<>]")
_SEPARATORS = frozenset({";", ";;", "&&", "||", "|", "|&", "&"})
_INTERPRETER = re.compile(r"python[0-9.]*")
_INTERPRETER_VARIABLE = re.compile(r"\$\{?\w*PYTHON\w*\}?", re.IGNORECASE)
_FD_REDIRECTION = re.compile(r"\d+[<>]")
RUNS_NO_COMMANDS = "command substitution: miles-check runs no commands"


@dataclass(frozen=True)
class Unresolved:
    """A word whose value the script does not determine; ``text`` is the shell text as written.

    ``several``: it stands for an unknown number of words even where quoted (an array's elements);
    ``unquoted``: it comes from an unquoted expansion, which bash splits at spaces. Neither: exactly one word.
    ``could_hold``: every word it could stand for, when the script says (a variable assigned under a
    condition holds what the condition's branch assigns or what it held before); None: anything.
    """

    text: str
    reason: str
    several: bool = False
    unquoted: bool = False
    could_hold: tuple | None = None


Word = str | Unresolved


@dataclass(frozen=True)
class Expansion:
    text: str  # e.g. "${PPO_ARGS[@]}", "$LR", "$(pwd)"
    quoted: bool  # inside double quotes: no word splitting


@dataclass(frozen=True)
class SimpleCommand:
    words: list  # annotated shlex words (quotes removed, expansions as markers)
    conditional: bool  # runs only if the command before it succeeded or failed (after && / ||)
    here_string: str | None = None  # the word after <<<, the command's standard input
    input_command: str | None = None  # the command of a `< <(command)` process substitution (annotated words)


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


def _process_substitution(pieces: list, start: int) -> tuple:
    """The words of the process substitution opening at ``pieces[start]``, and the index just past its ")"."""
    depth, index = 1, start + 1
    while index < len(pieces) and depth:
        depth += (pieces[index] in ("(", "<(", ">(")) - (pieces[index] == ")")
        index += 1
    return pieces[start + 1:index - 1 if depth == 0 else index], index


def simple_commands(tokens: list) -> list:
    """Split a command's tokens at ``;``/``&&``/``||``/``|``/``&`` into ``SimpleCommand``s.

    Redirections are dropped with their targets, except a here-string's word (``read -ra A <<< "$LINE"``
    reads it), kept as the command's ``here_string``, and a process substitution read as input
    (``mapfile -t A < <(cmd)``), kept as its ``input_command``. A process substitution given as an argument
    (``source <(cmd)``) stays among the words as ``(``, cmd's words, ``)``.
    """
    commands, current, redirection, conditional, inputs = [], [], None, False, {}
    pieces = []
    for token in tokens:
        found = _OPERATOR.findall(token) if _is_operator(token) else [token]
        pieces += found[:-2] + [token[-2:]] if token.endswith(("<(", ">(")) else found
    index = 0
    while index < len(pieces):
        piece = pieces[index]
        index += 1
        if piece in ("<(", ">("):
            words, index = _process_substitution(pieces, index - 1)
            if redirection == "<":
                inputs["input_command"] = " ".join(words)
            elif redirection is None:
                current += ["(", *words, ")"]
            redirection = None
        elif redirection is not None:
            inputs.update({"here_string": piece} if redirection == "<<<" else {})
            redirection = None
        elif piece in _SEPARATORS:
            commands.append(SimpleCommand(current, conditional, **inputs))
            current, inputs = [], {}
            conditional = piece in ("&&", "||") or (conditional and piece in ("|", "|&"))
        elif piece in ("(", ")") or not _OPERATOR.fullmatch(piece):
            current.append(piece)
        else:  # a redirection operator: its target word is not an argument
            redirection = piece
    commands.append(SimpleCommand(current, conditional, **inputs))
    return [command for command in commands if command.words]


# ---------------------------------------------------------------- resolving words


def _unsupported_reason(text: str) -> str:
    if text.startswith("$(("):
        return "arithmetic expansion is not evaluated"
    if text.startswith(("$(", "`")):
        return RUNS_NO_COMMANDS
    if _SCRIPT_PATH.fullmatch(text):
        return "$0, the script's own path, is not known when the arguments are checked alone"
    if _POSITIONAL.fullmatch(text):
        return "a positional parameter of the script, which has no value when the script is checked alone"
    return "this form of parameter expansion is not evaluated"


def _text(word) -> str:
    return word.text if isinstance(word, Unresolved) else word


def _unassigned(text: str, name: str, operator, word: str, variables: dict) -> Unresolved:
    unread = getattr(variables, "unread_sources", [])  # ScriptVariables knows the `source`s it could not follow
    origin = "; ".join(unread) if unread else "a sourced file"
    reason = f"{name} is not assigned in this script before this line (it would come from the environment or {origin}"
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
    if _SCRIPT_PATH.fullmatch(text) and "0" in variables:
        return _split_or_join(variables["0"], expansion)
    if text.startswith("$(") and not text.startswith("$(("):
        output = path_command_output(text[2:-1], variables)
        return _split_or_join([output if output is not None else Unresolved(text, RUNS_NO_COMMANDS)], expansion)
    match = _VARIABLE_FORM.fullmatch(text)
    if match is None:
        return [Unresolved(text, _unsupported_reason(text))]
    name, operator, word = match["plain"] or match["name"], match["operator"], match["word"]
    if name not in variables:
        unassigned = _unassigned(text, name, operator, word, variables)
        return [dataclasses.replace(unassigned, several=match["index"] in ("@", "*"))]
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
    if text.endswith(("[@]}", "[*]}")):  # an element keeps its own text: its place among the words matters
        return dataclasses.replace(value, reason=f"an element of {text}: {value.reason}")
    return dataclasses.replace(value, text=text, reason=f"{name}={value.text}: {value.reason}")


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
    unquoted = split and any(not expansions[int(index)].quoted for index in parts[1::2])
    return [dataclasses.replace(word, unquoted=True) if unquoted and isinstance(word, Unresolved) else word
            for word in _resolve_parts(parts, raw, expansions, variables, split)]


def _resolve_parts(parts: list, raw: str, expansions: list, variables: dict, split: bool) -> list:
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


def path_command_output(command: str, variables: dict) -> str | None:
    """The output of ``$(command)`` when it is a path idiom, or None (then it is not evaluated).

    A path idiom is ``cd``, ``pwd``, ``dirname``, ``basename``, ``realpath`` and ``readlink -f`` joined by
    ``&&`` (redirections such as ``&>/dev/null`` are dropped), all of whose words resolve: e.g.
    ``SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"`` is the script's folder.
    These commands print what the path text says, so nothing runs. A relative path whose meaning depends on
    the directory the script is started in is not evaluated.
    """
    annotated, expansions = annotate_expansions(command)
    try:
        tokens = _shell_tokens(annotated)
    except ValueError:
        return None
    if any(_is_operator(token) and set(_OPERATOR.findall(token)) & (_SEPARATORS - {"&&"}) for token in tokens):
        return None
    directory, output = None, []
    for simple in simple_commands(tokens):
        words = [value for raw in simple.words for value in resolve_words(raw, expansions, variables)]
        if any(isinstance(word, Unresolved) for word in words):
            return None
        name, operands = words[0], [word for word in words[1:] if not word.startswith("-")]
        paths = [os.path.join(directory or "", operand) for operand in operands]
        if any(not os.path.isabs(path) for path in paths) and name != "basename":
            return None
        if name == "cd" and len(paths) == 1:
            directory = os.path.normpath(paths[0])
        elif name == "pwd" and not operands and directory is not None:
            output.append(directory)
        elif name == "dirname" and paths:
            output += [os.path.dirname(os.path.normpath(path)) for path in paths]
        elif name == "basename" and operands:
            output.append(os.path.basename(os.path.normpath(operands[0])))
        elif (name == "realpath" or (name == "readlink" and "-f" in words)) and paths:
            output += [os.path.realpath(path) for path in paths]
        else:
            return None
    return "\n".join(output)


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


