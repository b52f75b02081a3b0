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
    # every other upstream flag is refused by name (departures.toml); the sum is stable as refused flags get
    # implemented (upstream's parser has about 1,030 options, Megatron's and SGLang's included)
    assert report.refused > 800 and report.shared + report.refused > 1000


EVAL_FIELDS = ("name", "path", "input_key", "label_key", "n_samples_per_eval_prompt", "temperature", "top_p",
               "top_k", "max_response_len")
RESOLVE_UPSTREAM = """
import dataclasses, json, sys
from types import SimpleNamespace
from miles.utils.eval_config import build_eval_dataset_configs, ensure_dataset_list
launch, datasets, defaults = json.loads(sys.stdin.read())
resolved = build_eval_dataset_configs(SimpleNamespace(**launch), ensure_dataset_list(datasets), defaults)
print(json.dumps([dataclasses.asdict(dataset) for dataset in resolved]))
"""


def test_an_eval_config_resolves_as_upstreams_eval_config_resolves_it(upstream_python, tmp_path):
    """Each dataset's fields (its own, the defaults', the launch's) against upstream's build_eval_dataset_configs."""
    import json
    import os
    import subprocess

    from miles.rollout.eval_config import eval_datasets
    from miles.utils.arguments import parse_args

    datasets = {"a": {"path": "/a.jsonl", "temperature": 0.25, "input_key": "question"},
                "b": {"path": "/b.jsonl", "top_k": 5, "max_response_len": 2}, "c": {"path": "/c.jsonl"}}
    defaults = {"n_samples_per_eval_prompt": 3, "top_p": 0.5}
    config = tmp_path / "eval.yaml"
    config.write_text(json.dumps({"eval": {"datasets": datasets, "defaults": defaults}}))  # JSON is YAML
    args = parse_args(argv=["--eval-config", str(config), "--rollout-temperature", "0.8", "--eval-max-response-len",
                            "6", "--label-key", "answer", "--n-samples-per-prompt", "2"])
    # upstream's launch namespace: the dests its resolution reads, as its parser leaves them (eval_* unset: None)
    launch = {"n_samples_per_eval_prompt": None, "n_samples_per_prompt": 2, "eval_temperature": None,
              "rollout_temperature": 0.8, "eval_top_p": None, "rollout_top_p": 1.0, "eval_top_k": None,
              "rollout_top_k": -1, "eval_max_response_len": 6, "rollout_max_response_len": args.rollout_max_response_len,
              "eval_input_key": None, "input_key": "prompt", "eval_label_key": None, "label_key": "answer",
              "eval_tool_key": None, "tool_key": None, "metadata_key": None}
    done = subprocess.run([str(upstream_python), "-c", RESOLVE_UPSTREAM], input=json.dumps([launch, datasets, defaults]),
                          capture_output=True, text=True, check=True, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})  # upstream's miles only
    upstream = [{field: dataset[field] for field in EVAL_FIELDS} for dataset in json.loads(done.stdout)]
    ours = [{field: getattr(dataset, field) for field in EVAL_FIELDS} for dataset in eval_datasets(args)]
    assert ours == upstream and len(ours) == 3
