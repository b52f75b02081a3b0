"""Startup rules of the TIS variants and OPSM (docs/corrections.md), through the real parser."""

import pytest

from miles.utils.arguments import parse_args, validate_async_off_policy_correction
from miles.utils.errors import AsyncOffPolicyCorrectionError, MilesConfigError

ICEPOP = "miles.backends.training_utils.loss_hub.corrections.icepop_function"


def test_async_ppo_with_only_opsm_is_refused_with_the_contract_error():
    args = parse_args(argv=["--advantage-estimator", "ppo", "--use-opsm"])
    with pytest.raises(AsyncOffPolicyCorrectionError, match="behavior-policy correction") as info:
        validate_async_off_policy_correction(args)
    assert "--use-opsm alone is not a correction" in str(info.value)
    validate_async_off_policy_correction(parse_args(argv=["--advantage-estimator", "ppo", "--use-opsm", "--use-tis"]))


@pytest.mark.parametrize("argv", [
    ["--use-tis", "--tis-mode", "mask", "--tis-level", "sequence"],
    ["--use-tis", "--tis-mode", "truncate", "--rs-level", "geometric", "--rs-lower-bound", "0.99",
     "--rs-upper-bound", "1.01", "--rs-veto-threshold", "1e-4"],
    ["--use-tis", "--custom-tis-function-path", ICEPOP],
])
def test_each_tis_variant_counts_as_a_correction_under_use_tis(argv):
    validate_async_off_policy_correction(parse_args(argv=["--advantage-estimator", "ppo", *argv]))


@pytest.mark.parametrize("argv, named", [
    (["--tis-mode", "mask"], "--tis-mode"),
    (["--tis-level", "geometric"], "--tis-level"),
    (["--rs-level", "token"], "--rs-level"),
    (["--rs-veto-threshold", "1e-4"], "--rs-veto-threshold"),
    (["--custom-tis-function-path", ICEPOP], "--custom-tis-function-path"),
])
def test_a_tis_variant_without_use_tis_is_refused(argv, named):
    with pytest.raises(MilesConfigError, match=f"{named} set without --use-tis.*Add --use-tis"):
        parse_args(argv=["--advantage-estimator", "grpo", *argv])


@pytest.mark.parametrize("argv, message", [
    (["--use-tis", "--custom-tis-function-path", ICEPOP, "--tis-mode", "mask"], "--tis-mode would be ignored"),
    (["--use-tis", "--tis-mode", "truncate", "--tis-clip-low", "0.5"], "truncate has no lower bound"),
    (["--use-tis", "--rs-lower-bound", "0.9"], "without --rs-level"),
    (["--use-tis", "--rs-level", "token", "--rs-lower-bound", "3"], r"band \[3.0, 2.0\] .* is empty"),
    (["--use-tis", "--custom-tis-function-path", "no_such_module.fn"],
     "--custom-tis-function-path is 'no_such_module.fn', but its module 'no_such_module' cannot be imported"),
    (["--use-tis", "--rs-veto-threshold", "0"], "--rs-veto-threshold is 0.0, but it must be > 0 and < 1"),
    (["--opsm-delta=-1"], "--opsm-delta is -1.0, but it must be >= 0"),
])
def test_inconsistent_choices_are_refused_naming_value_rule_and_fix(argv, message):
    with pytest.raises(MilesConfigError, match=message):
        parse_args(argv=["--advantage-estimator", "ppo", *argv])


def test_upstream_defaults():
    args = parse_args(argv=[])
    assert (args.tis_mode, args.tis_level, args.rs_level, args.rs_veto_threshold) == ("clip", "token", None, None)
    assert (args.custom_tis_function_path, args.use_opsm, args.opsm_delta) == (None, False, 1e-4)
