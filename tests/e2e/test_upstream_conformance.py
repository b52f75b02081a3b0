"""miles' parser against upstream miles' own (miles-rl 0.0.2), built in its separate environment (docs/conformance.md).

The first run builds .venv-upstream (about a minute: two wheels installed without dependencies); later runs reuse it.
Needs the [sglang] extra: upstream's parser imports SGLang's server arguments and their dependencies."""

import pytest

from miles.conformance.report import run_conformance
from miles.conformance.upstream_env import ensure_upstream_env, upstream_parser_dump
from tests.e2e.sglang_marks import needs_sglang

pytestmark = [pytest.mark.e2e, needs_sglang, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def upstream_python():
    return ensure_upstream_env()


def test_the_dump_is_upstreams_own_parser_with_its_default_setting_step(upstream_python):
    dump = upstream_parser_dump(upstream_python, [["--rollout-batch-size", "4", "--advantage-estimator", "ppo"],
                                                  ["--advantage-estimator", "grpo"]])
    options = dump["options"]
    # literals read from upstream's source (miles/utils/arguments.py, megatron/training/arguments.py of miles-rl 0.0.2)
    assert options["--disable-grpo-std-normalization"]["dest"] == "grpo_std_normalization"
    assert options["--disable-grpo-std-normalization"]["action"] == "store_false"
    assert options["--lr"]["default"] == 1e-06 and options["--rollout-batch-size"]["required"] is True
    assert "--tensor-model-parallel-size" in options and "--sglang-mem-fraction-static" in options  # Megatron's, SGLang's
    parsed, refused = dump["namespaces"]
    namespace = parsed["namespace"]
    assert namespace["use_critic"] is True and namespace["rollout_batch_size"] == 4
    assert namespace["use_distributed_optimizer"] is True  # set by upstream's set_default_megatron_args
    assert set(refused) == {"error"} and "--rollout-batch-size" in refused["error"]


def test_miles_parser_conforms_to_upstreams(upstream_python):
    report = run_conformance(lambda command_lines: upstream_parser_dump(upstream_python, command_lines))
    print("\n".join(report.lines()))
    assert report.failures == []
    assert report.shared >= 90 and report.command_lines > 100  # the flags and lines compared, not an empty check
    assert report.refused > 900  # every other upstream flag is refused by name (departures.toml)
