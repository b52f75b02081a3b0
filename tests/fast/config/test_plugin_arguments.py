"""A custom generate function's own flags (upstream's ``generate.add_arguments = ...`` hook) and a driver's
(``parse_args(add_custom_arguments=...)``) parse, as upstream lets them, even where the refused table names the same
flag; without the code that defines them, those flags are refused in one line, and a clash with a flag miles
implements stays argparse's error."""

import argparse
import textwrap

import pytest

from miles.config.arguments import parse_args
from miles.config.departures import load_refusals

PLUGIN = textwrap.dedent('''
    import argparse


    async def generate(args, sample, sampling_params):
        return sample


    def _add_arguments(parser: argparse.ArgumentParser):
        parser.add_argument("--agent-base-url", type=str)
        parser.add_argument("--generate-multi-samples", action="store_true", default=False)


    generate.add_arguments = _add_arguments


    async def plain(args, sample, sampling_params):
        return sample
''')


@pytest.fixture
def plugin(importable_module):
    return importable_module("agent_plugin", PLUGIN)


def test_the_generate_functions_flags_parse_with_their_values(plugin):
    assert "--agent-base-url" in load_refusals()  # the upstream adapter's flag: the plug-in's definition replaces it
    args = parse_args(argv=["--custom-generate-function-path", f"{plugin}.generate",
                            "--agent-base-url", "http://127.0.0.1:8000", "--generate-multi-samples"])
    assert args.agent_base_url == "http://127.0.0.1:8000" and args.generate_multi_samples is True
    args = parse_args(argv=["--custom-generate-function-path", f"{plugin}.generate"])
    assert args.agent_base_url is None and args.generate_multi_samples is False  # the plug-in's own defaults


def test_a_function_without_the_hook_adds_no_flag(plugin, capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_args(argv=["--custom-generate-function-path", f"{plugin}.plain", "--agent-base-url", "x"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err  # without the plug-in's definition it is the refused upstream example flag
    assert "--agent-base-url x: " in err and "unrecognized" not in err and err.count("error:") == 1


def test_a_path_that_does_not_load_leaves_the_parse_as_without_it():
    args = parse_args(argv=["--custom-generate-function-path", "no_such_module.generate"])
    assert args.custom_generate_function_path == "no_such_module.generate"  # the preflight refuses it, with why


def test_a_drivers_custom_arguments_replace_refused_flags_but_never_miles_own():
    def add_rlve_arguments(parser):  # as upstream's examples/RLVE/train.py passes to parse_args
        parser.add_argument("--rlve", action="store_true", default=False)
        group = parser.add_argument_group("RLVE")
        group.add_argument("--environment-list", nargs="+", default=[])
        return parser

    args = parse_args(add_custom_arguments=add_rlve_arguments, argv=["--rlve", "--environment-list", "a", "b"])
    assert args.rlve is True and args.environment_list == ["a", "b"]
    with pytest.raises(argparse.ArgumentError, match="conflicting option string: --lr"):
        parse_args(add_custom_arguments=lambda parser: parser.add_argument("--lr", type=float), argv=[])


def test_without_the_code_that_defines_them_they_are_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_args(argv=["--rlve", "--environment-list", "a", "--agent-base-url", "x"])
    assert stopped.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert all(flag in line for flag in ("--rlve", "--environment-list a", "--agent-base-url x"))


def test_miles_check_agrees_with_the_driver_on_a_plugins_flags(plugin):
    from miles.check import check_launch

    words = ["--advantage-estimator", "grpo", "--agent-base-url", "http://h", "--generate-multi-samples"]
    loaded = check_launch(["--custom-generate-function-path", f"{plugin}.generate", *words], strict=True)
    assert (loaded.status, loaded.errors, loaded.ignored) == ("OK", [], [])
    without = check_launch(["--custom-generate-function-path", f"{plugin}.plain", *words], strict=True)
    assert without.status == "REJECTED" and without.ignored == []
    (message, _), = without.errors
    assert "--agent-base-url http://h, --generate-multi-samples: " in message
