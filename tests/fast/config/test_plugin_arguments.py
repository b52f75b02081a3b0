"""A custom generate function's own flags (upstream's ``generate.add_arguments = ...`` hook) parse, as upstream's
``add_user_provided_function_arguments`` lets them; without the hook they are unrecognized."""

import sys
import textwrap

import pytest

from miles.config.arguments import parse_args

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
def plugin(tmp_path, monkeypatch):
    (tmp_path / "agent_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "agent_plugin"
    sys.modules.pop("agent_plugin", None)


def test_the_generate_functions_flags_parse_with_their_values(plugin):
    args = parse_args(argv=["--custom-generate-function-path", f"{plugin}.generate",
                            "--agent-base-url", "http://127.0.0.1:8000", "--generate-multi-samples"])
    assert args.agent_base_url == "http://127.0.0.1:8000" and args.generate_multi_samples is True
    args = parse_args(argv=["--custom-generate-function-path", f"{plugin}.generate"])
    assert args.agent_base_url is None and args.generate_multi_samples is False  # the plug-in's own defaults


def test_a_function_without_the_hook_adds_no_flag(plugin, capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_args(argv=["--custom-generate-function-path", f"{plugin}.plain", "--agent-base-url", "x"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --agent-base-url x" in err and err.count("error:") == 1


def test_a_path_that_does_not_load_leaves_the_parse_as_without_it():
    args = parse_args(argv=["--custom-generate-function-path", "no_such_module.generate"])
    assert args.custom_generate_function_path == "no_such_module.generate"  # the preflight refuses it, with why
