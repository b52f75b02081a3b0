"""The conformance report's three checks, driven by a stand-in for upstream's dump built from miles' own parser, so
that each kind of failure can be made to happen (the real upstream parser: tests/e2e/test_upstream_conformance.py)."""

import pytest

from miles.conformance import report
from miles.conformance.compare import split_refused
from miles.conformance.parser_spec import describe_parser, parse_command_line
from miles.conformance.report import contract_command_lines, run_conformance, sample_command_lines
from miles.utils.arguments import build_parser

BASE = ["--rollout-batch-size", "16"]


def _dump_from_miles(change_namespace=None):
    """upstream_dump as if upstream's parser were miles' own, with upstream's derivation of use_critic and
    ``change_namespace(namespace)`` applied after it."""
    parser = build_parser()

    def finish(namespace):
        namespace.use_critic = namespace.advantage_estimator == "ppo"
        if change_namespace is not None:
            change_namespace(namespace)

    def dump(command_lines):
        return {"options": describe_parser(parser),
                "namespaces": [parse_command_line(parser, words, finish) for words in command_lines]}

    return dump


@pytest.fixture
def nothing_listed(monkeypatch):
    """No departures and no added flags, as is right when 'upstream' is miles' own parser."""
    monkeypatch.setattr(report, "load_departures", dict)
    monkeypatch.setattr(report, "load_additions", dict)


def test_sample_command_lines_cover_every_choice_or_one_value_of_the_type():
    assert sample_command_lines("--fast", {"action": "store_true", "choices": None, "type": None, "nargs": 0}) == [
        [*BASE, "--fast"]]
    assert sample_command_lines("--s", {"action": "store", "choices": ["a", "b"], "type": "str", "nargs": None}) == [
        [*BASE, "--s", "a"], [*BASE, "--s", "b"]]
    assert sample_command_lines("--n", {"action": "store", "choices": None, "type": "int", "nargs": None}) == [
        [*BASE, "--n", "3"]]
    assert sample_command_lines("--f", {"action": "store", "choices": None, "type": "str", "nargs": "+"}) == [
        [*BASE, "--f", "sample", "sample"]]
    assert sample_command_lines("--c", {"action": "store", "choices": None, "type": "own_fn", "nargs": None}) == []


def test_contract_lines_are_every_estimator_with_every_subset_of_the_three_corrections():
    estimators = describe_parser(build_parser())["--advantage-estimator"]["choices"]
    assert estimators == ["grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"]
    lines = contract_command_lines(estimators)
    assert len(lines) == 5 * 8
    assert [*BASE, "--advantage-estimator", "ppo"] in lines
    assert [*BASE, "--advantage-estimator", "grpo", "--use-rollout-logprobs", "--use-tis", "--keep-old-actor"] in lines


def test_a_parser_identical_to_miles_conforms(nothing_listed):
    result = run_conformance(_dump_from_miles())
    assert result.failures == [] and result.differences == []
    implemented, refused = split_refused(describe_parser(build_parser()))
    assert result.shared == len(implemented) and result.refused == len(refused) > 899
    assert result.lines()[-1].startswith("conformance: OK")


def test_a_default_that_differs_unlisted_fails(nothing_listed):
    result = run_conformance(_dump_from_miles(lambda ns: setattr(ns, "eps_clip", 0.3)))
    assert "undocumented departure: --eps-clip: default is 0.2 in miles, 0.3 upstream" in result.failures
    assert result.lines()[-1].startswith("conformance: ") and "failures" in result.lines()[-1]


def test_a_value_parsed_differently_fails(nothing_listed):
    def double_lr(ns):
        ns.lr = ns.lr * 2

    failures = run_conformance(_dump_from_miles(double_lr)).failures
    assert any(line.startswith("--rollout-batch-size 16 --lr 0.25: --lr: miles 0.25, upstream 0.5") for line in failures)


def test_a_contract_verdict_that_differs_fails(nothing_listed):
    # an upstream that derived use_critic from something else would let async PPO through uncorrected
    failures = run_conformance(_dump_from_miles(lambda ns: setattr(ns, "use_critic", False))).failures
    assert ("train_async.py --rollout-batch-size 16 --advantage-estimator ppo: the contract's verdict differs: "
            "miles refused, upstream's namespace accepted") in failures
    assert sum("verdict differs" in line for line in failures) == 1  # only the uncorrected ppo line


def test_a_listed_departure_that_is_gone_fails_and_an_unlisted_added_flag_fails():
    result = run_conformance(_dump_from_miles())  # the real table, against 'upstream' = miles
    assert any(line.startswith("listed in departures.toml but no longer different: --lr: default")
               for line in result.failures)
