"""parser_spec: the records both sides of the conformance check compare, checked against hand-written literals."""

import argparse
import ast
import enum
import sys
from pathlib import Path

from miles.conformance import parser_spec
from miles.conformance.parser_spec import describe_parser, jsonable, parse_command_line


def _to_upper(word: str) -> str:
    return word.upper()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--name")
    parser.add_argument("--fast", action="store_true")
    parser.add_argument("--no-norm", action="store_false", dest="norm")
    parser.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--style", choices=["a", "b"], default="a")
    parser.add_argument("--files", nargs="+", type=str)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--shout", type=_to_upper, default="x")
    return parser


def test_each_kind_of_action_is_described_as_argparse_holds_it():
    options = describe_parser(_parser())
    assert "--help" not in options
    assert options["--steps"] == {"dest": "steps", "default": 3, "type": "int", "choices": None, "action": "store",
                                  "nargs": None, "required": False}
    # no type keeps the word as it is, as type=str does
    assert options["--name"]["type"] == "str" and options["--name"]["default"] is None
    assert options["--fast"] == {"dest": "fast", "default": False, "type": None, "choices": None,
                                 "action": "store_true", "nargs": 0, "required": False}
    assert options["--no-norm"]["dest"] == "norm" and options["--no-norm"]["action"] == "store_false"
    assert options["--no-norm"]["default"] is True
    assert options["--plots"] == options["--no-plots"]
    assert options["--plots"]["action"] == "boolean_optional" and options["--plots"]["default"] is True
    assert options["--style"]["choices"] == ["a", "b"]
    assert options["--files"]["nargs"] == "+"
    assert options["--size"]["required"] is True
    assert options["--shout"]["type"] == "_to_upper"


def test_values_that_json_cannot_hold_still_compare():
    class Mode(enum.Enum):
        FAST = "fast"

    assert jsonable(Mode.FAST) == "fast"
    assert jsonable((1, 2.5, None)) == [1, 2.5, None]
    assert jsonable({"a": (True,)}) == {"a": [True]}
    assert jsonable(_to_upper) == {"repr": repr(_to_upper)}


def test_a_command_line_gives_its_namespace_after_the_default_setting_step_or_the_parsers_error():
    def finish(namespace):
        namespace.doubled = namespace.steps * 2

    parsed = parse_command_line(_parser(), ["--size", "1", "--steps", "5", "--shout", "hi"], finish)
    assert parsed["namespace"]["doubled"] == 10 and parsed["namespace"]["shout"] == "HI"
    refused = parse_command_line(_parser(), ["--size", "one"])
    assert set(refused) == {"error"} and "--size" in refused["error"] and "'one'" in refused["error"]


def test_the_script_imports_only_the_standard_library_at_module_level():
    # upstream's environment runs it with upstream's own `miles`: importing this project's would break the dump
    tree = ast.parse(Path(parser_spec.__file__).read_text())
    top_level = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top_level |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            top_level.add((node.module or "").split(".")[0])
    assert top_level and top_level <= set(sys.stdlib_module_names) | {"__future__"}, top_level
