"""What an argparse parser accepts, as JSON: one record per option string (dest, default, type, choices, action,
nargs, required), and the namespaces it gives for given command lines.

This file imports only the standard library and nothing of ``miles``, because it runs on both sides of the
conformance check (docs/conformance.md): imported in miles' environment for miles' parser, and run as a script by
the separate upstream environment's Python, where ``miles`` is upstream's own package. Run as a script it builds
upstream's parser exactly as upstream's ``parse_args`` does for the megatron backend (Megatron-LM's arguments, then
``get_miles_extra_args_provider()``, which adds miles' and SGLang's), reads ``{"command_lines": [[word, ...], ...]}``
on stdin and prints ``{"options": ..., "namespaces": [...]}`` on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import io
import json
import sys

# argparse's action classes by what they do; any other class (a library's own action) is named by its class.
_ACTION_KINDS = {
    argparse._StoreAction: "store",
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._StoreConstAction: "store_const",
    argparse._AppendAction: "append",
    argparse._AppendConstAction: "append_const",
    argparse._CountAction: "count",
    argparse.BooleanOptionalAction: "boolean_optional",
}


def jsonable(value):
    """``value`` as JSON: numbers, strings, booleans and None as they are, lists and tuples as lists, enums by
    their value; anything else (a function, an object) as ``{"repr": repr(value)}``, so it still compares."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    return {"repr": repr(value)}


def _type_name(action: argparse.Action) -> str | None:
    """The name of the function that converts the flag's value; an action that takes a value but has no ``type``
    keeps the word as it is, exactly what ``type=str`` does, so both are ``"str"``."""
    if action.type is None:
        return None if action.nargs == 0 else "str"
    return getattr(action.type, "__name__", type(action.type).__name__)


def describe_action(action: argparse.Action) -> dict:
    return {
        "dest": action.dest,
        "default": jsonable(action.default),
        "type": _type_name(action),
        "choices": None if action.choices is None else jsonable(list(action.choices)),
        "action": _ACTION_KINDS.get(type(action), type(action).__name__),
        "nargs": action.nargs,
        "required": action.required,
    }


def describe_parser(parser: argparse.ArgumentParser) -> dict[str, dict]:
    """Every long option string (``--flag``) of ``parser`` -> ``describe_action`` of its action (``--help`` left
    out). A flag's aliases each get the record of their shared action."""
    options = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        for option in action.option_strings:
            if option.startswith("--"):
                options[option] = describe_action(action)
    return options


def parse_command_line(parser: argparse.ArgumentParser, words: list[str], finish=None) -> dict:
    """``{"namespace": {dest: value}}`` for ``words``, after ``finish(namespace)`` (a default-setting step) if
    given, or ``{"error": message}`` where the parser refuses them."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            namespace = parser.parse_args(words)
    except SystemExit:
        return {"error": stderr.getvalue().strip().splitlines()[-1]}
    if finish is not None:
        finish(namespace)
    return {"namespace": {dest: jsonable(value) for dest, value in vars(namespace).items()}}


def _upstream_parser() -> argparse.ArgumentParser:
    """Upstream's parser as ``miles.utils.arguments.parse_args`` assembles it for ``--train-backend megatron`` (its
    default): ``megatron.training.arguments.parse_args`` builds this parser, then adds miles' flags."""
    from megatron.training.arguments import add_megatron_arguments

    from miles.utils.arguments import get_miles_extra_args_provider

    parser = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
    parser = add_megatron_arguments(parser)
    return get_miles_extra_args_provider()(parser)


def _upstream_defaults(namespace: argparse.Namespace) -> None:
    """Upstream's default-setting step after parsing (``miles.utils.arguments.parse_args``, megatron backend), and
    the one derived value the async contract reads, as upstream's ``miles_validate_args`` derives it. The rest of
    ``miles_validate_args`` reads the checkpoint and the data, which a command line alone does not have."""
    from miles.backends.megatron_utils.arguments import set_default_megatron_args

    namespace.rank = 0
    namespace.world_size = namespace.actor_num_nodes * namespace.actor_num_gpus_per_node
    set_default_megatron_args(namespace)
    namespace.use_critic = namespace.advantage_estimator == "ppo"


def main() -> None:
    request = json.load(sys.stdin)
    with contextlib.redirect_stdout(sys.stderr):  # upstream logs to stdout at import; stdout carries the JSON
        parser = _upstream_parser()
        result = {
            "options": describe_parser(parser),
            "namespaces": [parse_command_line(parser, words, _upstream_defaults) for words in request["command_lines"]],
        }
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
