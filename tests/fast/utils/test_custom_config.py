"""--custom-config-path: a YAML file's keys become attributes of args (upstream's rule), and may not change a flag."""

import pytest

from miles.utils.arguments import parse_args
from miles.utils.errors import MilesConfigError

HOOK = ["--use-tis", "--custom-tis-function-path", "examples.tis_hook.cp_tis.compute_tis_weights_with_cp"]


def _parse(tmp_path, text: str, *argv):
    path = tmp_path / "custom.yaml"
    path.write_text(text)
    return parse_args(argv=["--advantage-estimator", "ppo", *argv, "--custom-config-path", str(path)])


def test_new_keys_become_attributes_of_args_and_are_logged_as_derived(tmp_path):
    args = _parse(tmp_path, "tis_batch_normalize: true\ntis_upper_bound: 2.0\nuse_tis: true\n", *HOOK)
    assert args.tis_batch_normalize is True and args.tis_upper_bound == 2.0
    assert "tis_batch_normalize = True (from --custom-config-path)" in args.derived


def test_a_key_that_would_change_a_flag_is_refused_in_one_line(tmp_path):
    with pytest.raises(MilesConfigError) as info:
        _parse(tmp_path, "eps_clip: 0.3\n")
    message = str(info.value)
    assert "\n" not in message and "eps_clip: 0.3" in message and "--eps-clip" in message and "0.2" in message


def test_a_key_may_not_switch_a_correction_or_a_derived_value(tmp_path):
    with pytest.raises(MilesConfigError, match="use_tis: True"):
        _parse(tmp_path, "use_tis: true\n")  # the contract's verdict was reached on the command line
    with pytest.raises(MilesConfigError, match="use_critic: False"):
        _parse(tmp_path, "use_critic: false\n", "--keep-old-actor")


def test_the_builtin_tis_settings_configure_a_hook_that_replaces_the_builtin(tmp_path):
    text = "tis_mode: truncate\nrs_level: token\nrs_veto_threshold: 1.0e-4\ntis_batch_normalize: true\n"
    args = _parse(tmp_path, text, *HOOK)
    assert (args.tis_mode, args.rs_level, args.rs_veto_threshold) == ("truncate", "token", 1e-4)
    with pytest.raises(MilesConfigError, match="tis_mode: 'truncate'"):
        _parse(tmp_path, text, "--use-tis")  # without a hook they would change the built-in: refused


@pytest.mark.parametrize("text, needle", [("- a\n- b\n", "holds a list"), ("a: [1,\n", "is not valid YAML")])
def test_a_file_that_is_no_mapping_is_refused(tmp_path, text, needle):
    with pytest.raises(MilesConfigError, match=needle):
        _parse(tmp_path, text)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(MilesConfigError, match="cannot be read \\(No such file or directory\\)") as info:
        parse_args(argv=["--custom-config-path", str(tmp_path / "absent.yaml")])
    assert "\n" not in str(info.value)
