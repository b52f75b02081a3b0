"""The corrections table (miles/config/corrections.py) is the one declaration of a behavior-policy correction: a row
added here, in a test, is a flag, a correction the contract, miles-check and the per-batch guard accept, and a plot
page, with no other edit."""

from types import SimpleNamespace

import pytest

from miles.check import check_launch
from miles.config import corrections
from miles.config.arguments import build_parser, contract_message, parse_args, validate_async_off_policy_correction
from miles.guard.off_policy import check_correction_per_batch
from miles.tracking.plot import off_policy_panels
from miles.utils.errors import AsyncOffPolicyCorrectionError, OffPolicyGuardError

NEW = corrections.Correction(
    label="new_fix", dest="use_new_fix", denominator=corrections.CURRENT, needs_rollout_log_probs=True,
    satisfies_contract=True, does="a new correction re-weights the loss by pi_old/pi_rollout",
    why="its weight is the behavior policy's own", panels=("new_fix_weight", "staleness_max"),
)
SHIPPED = ("rollout_logprobs", "tis", "keep_old_actor")  # written out: the rows the docs and upstream know


@pytest.fixture
def with_new_row(monkeypatch):
    monkeypatch.setattr(corrections, "CORRECTIONS", (*corrections.CORRECTIONS, NEW))


def _ppo(**flags) -> SimpleNamespace:
    return SimpleNamespace(use_critic=True, use_rollout_logprobs=False, use_tis=False, keep_old_actor=False, **flags)


def test_the_shipped_table_is_upstreams_three_corrections():
    assert tuple(row.label for row in corrections.CORRECTIONS) == SHIPPED
    assert [row.flag for row in corrections.contract_corrections()] == [
        "--use-rollout-logprobs", "--use-tis", "--keep-old-actor"]


def test_each_row_is_a_store_true_flag_of_the_parser_with_its_clause_in_help():
    actions = {action.dest: action for action in build_parser()._actions}
    for row in corrections.CORRECTIONS:
        action = actions[row.dest]
        assert action.option_strings == [row.flag] and action.default is False and action.const is True
        assert row.does in action.help


def test_the_contract_error_lists_each_contract_row_with_its_clause():
    message = contract_message()
    for row in corrections.contract_corrections():
        assert f"{row.flag}  " in message and row.does in message
    # one line per row, flags aligned in one column, the last ending the list
    lines = [line for line in message.splitlines() if line.startswith("  --")]
    assert len(lines) == len(corrections.contract_corrections())
    assert len({line.index(row.does) for line, row in zip(lines, corrections.contract_corrections())}) == 1
    assert lines[-1].endswith(".") and all(line.endswith(";") for line in lines[:-1])


def test_a_row_added_in_a_test_is_accepted_by_the_validator_miles_check_and_the_guard(with_new_row):
    # the validator: the new flag alone satisfies the contract; without it async PPO is refused, naming it
    validate_async_off_policy_correction(_ppo(use_new_fix=True))
    with pytest.raises(AsyncOffPolicyCorrectionError, match="behavior-policy correction") as caught:
        validate_async_off_policy_correction(_ppo(use_new_fix=False))
    assert "--use-new-fix" in str(caught.value) and NEW.does in str(caught.value)
    # the parser has the flag, and the launch passes every rule
    args = parse_args(argv=["--advantage-estimator", "ppo", "--use-new-fix"])
    assert args.use_new_fix is True and corrections.in_effect(args).labels == ("new_fix",)
    # miles-check, on the same argument list
    verdict = check_launch(["--advantage-estimator", "ppo", "--use-new-fix"])
    assert verdict.status == "OK" and verdict.contract == "contract: OK (--use-new-fix)", verdict
    refused = check_launch(["--advantage-estimator", "ppo"])
    assert refused.status == "REJECTED"
    # the per-batch guard: a stale PPO rollout with the new row in effect trains; without any row it does not
    check_correction_per_batch(3, 1, True, corrections.InEffect(("new_fix",)))
    with pytest.raises(OffPolicyGuardError, match="in effect: none"):
        check_correction_per_batch(3, 1, True, corrections.InEffect())
    # the trainer's view of it: re-weights the current actor's recompute, needs the engine's log-probs
    new_fix = corrections.InEffect(("new_fix",))
    assert new_fix.label == "new_fix"
    assert new_fix.denominator == corrections.CURRENT
    assert new_fix.needs_rollout_log_probs
    # the plots: its page shows its panels first
    series = {"off_policy/new_fix_weight": ([0, 1], [0.5, 1.5]), "off_policy/staleness_max": ([0, 1], [0.0, 1.0])}
    assert off_policy_panels(series, "new_fix")[:2] == ["off_policy/new_fix_weight", "off_policy/staleness_max"]


def test_a_row_that_does_not_satisfy_the_contract_is_refused_by_the_validator_and_the_guard(monkeypatch):
    mask_only = corrections.Correction(
        label="mask_only", dest="use_mask_only", denominator=corrections.CURRENT, needs_rollout_log_probs=False,
        satisfies_contract=False, does="masks sequences", why="its ratio is still the current actor's", panels=())
    monkeypatch.setattr(corrections, "CORRECTIONS", (*corrections.CORRECTIONS, mask_only))
    with pytest.raises(AsyncOffPolicyCorrectionError) as caught:
        validate_async_off_policy_correction(_ppo(use_mask_only=True))
    assert "--use-mask-only is set, but it is not one: its ratio is still the current actor's." in str(caught.value)
    assert "--use-mask-only" not in contract_message()
    with pytest.raises(OffPolicyGuardError, match="in effect: mask_only"):
        check_correction_per_batch(3, 1, True, corrections.InEffect(("mask_only",)))


@pytest.mark.parametrize(("labels", "source"), [
    ((), "current"), (("tis",), "current"), (("keep_old_actor",), "snapshot"), (("rollout_logprobs",), "rollout"),
    (("keep_old_actor", "tis"), "snapshot"), (("rollout_logprobs", "keep_old_actor"), "rollout"),
])
def test_the_denominator_of_a_combination(labels, source):
    # docs/design.md §3: the engine's log-probs replace any recompute; a snapshot replaces the current actor
    assert corrections.InEffect(labels).denominator == source


def test_an_unknown_label_names_the_table():
    with pytest.raises(KeyError, match="rollout_logprobs, tis, keep_old_actor"):
        corrections.correction("opsm")
