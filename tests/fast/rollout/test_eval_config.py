"""--eval-config and --eval-prompt-data NAME PATH (miles/rollout/eval_config.py): upstream's format resolved as
upstream resolves it, one-line refusals, and per-dataset evaluation through the rollout manager with a stand-in
engine whose samples are made by hand."""

import json
from pathlib import Path

import pytest

from miles.ray import rollout_manager as rollout_manager_module
from miles.ray.rollout_manager import RolloutManager
from miles.rollout.eval_config import EvalDataset, eval_datasets
from miles.utils.arguments import parse_args
from miles.utils.errors import MilesConfigError
from miles.utils.types import Sample, SampleStatus


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _args(*argv: str):
    return parse_args(argv=["--train-backend", "torch", *argv])


def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "eval.yaml"
    path.write_text(text)
    return str(path)


def test_each_field_is_the_datasets_then_the_defaults_then_the_launchs(tmp_path):
    config = _config(tmp_path, """
eval:
  defaults: {n_samples_per_eval_prompt: 3, temperature: 0.5}
  datasets:
    - {name: a, path: /data/a.jsonl, temperature: 0.25, top_k: 4, stop: ["\\n"], input_key: question}
    - {name: b, path: /data/b.jsonl, max_response_len: 2, stop_token_ids: [7]}
""")
    args = _args("--eval-config", config, "--eval-max-response-len", "6", "--eval-top-p", "0.9",
                 "--rollout-temperature", "0.8", "--label-key", "answer", "--rollout-stop", "=")
    a, b = eval_datasets(args)
    assert a == EvalDataset(name="a", path="/data/a.jsonl", rm_type="math_exact", input_key="question",
                            label_key="answer", n_samples_per_eval_prompt=3, temperature=0.25, top_p=0.9, top_k=4,
                            max_response_len=6, stop=("\n",), stop_token_ids=())
    assert b == EvalDataset(name="b", path="/data/b.jsonl", rm_type="math_exact", input_key="prompt",
                            label_key="answer", n_samples_per_eval_prompt=3, temperature=0.5, top_p=0.9, top_k=-1,
                            max_response_len=2, stop=("=",), stop_token_ids=(7,))


def test_the_eval_keys_come_before_the_launchs_keys_and_after_the_datasets_own(tmp_path):
    # upstream's order: the dataset's key, the config's defaults, --eval-input-key / --eval-label-key, the launch's
    config = _config(tmp_path, """
eval:
  datasets:
    - {name: own, path: /o.jsonl, input_key: question, label_key: solution}
    - {name: flags, path: /f.jsonl}
""")
    args = _args("--eval-config", config, "--eval-input-key", "problem", "--eval-label-key", "answer",
                 "--input-key", "text", "--label-key", "gold")
    own, flags = eval_datasets(args)
    assert (own.input_key, own.label_key) == ("question", "solution")
    assert (flags.input_key, flags.label_key) == ("problem", "answer")
    plain = eval_datasets(_args("--eval-config", config, "--input-key", "text", "--label-key", "gold"))[1]
    assert (plain.input_key, plain.label_key) == ("text", "gold")


def test_datasets_keyed_by_name_at_the_root_and_the_config_overrides_eval_prompt_data(tmp_path):
    config = _config(tmp_path, "datasets:\n  x: {path: /x.jsonl}\n  y: {path: /y.jsonl, rm_type: math_exact}\n")
    args = _args("--eval-config", config, "--eval-prompt-data", "z", "/z.jsonl", "--n-samples-per-prompt", "2")
    assert [(d.name, d.path, d.n_samples_per_eval_prompt) for d in eval_datasets(args)] == [
        ("x", "/x.jsonl", 2), ("y", "/y.jsonl", 2)]


def test_eval_prompt_data_takes_name_path_pairs_or_one_path_named_as_upstream_names_it():
    pairs = eval_datasets(_args("--eval-prompt-data", "gsm8k", "/g.jsonl", "aime", "/a.jsonl"))
    assert [(d.name, d.path) for d in pairs] == [("gsm8k", "/g.jsonl"), ("aime", "/a.jsonl")]
    assert [(d.name, d.path) for d in eval_datasets(_args("--eval-prompt-data", "/a.jsonl"))] == [("aime", "/a.jsonl")]
    assert eval_datasets(_args()) == []
    with pytest.raises(MilesConfigError, match=r"^--eval-prompt-data a /a.jsonl b: 3 words, .*NAME PATH pairs"):
        eval_datasets(_args("--eval-prompt-data", "a", "/a.jsonl", "b"))


@pytest.mark.parametrize(("text", "pattern"), [
    ("eval:\n  datasets:\n    - {name: a, path: /a, rm_tpye: x}\n",
     r"dataset 'a': unknown key `rm_tpye`; the keys are input_key, label_key, max_response_len, "),
    ("eval:\n  datasets:\n    - {name: a, path: /a, tool_key: tools}\n",
     r"dataset 'a': the key `tool_key` is upstream's, but tool schemas .* Drop it"),
    ("eval:\n  defaults: {min_new_tokens: 2}\n  datasets:\n    - {name: a, path: /a}\n",
     r"`defaults`: the key `min_new_tokens` is upstream's"),
    ("eval:\n  datasets:\n    - {name: a, path: /a}\n    - {name: a, path: /b}\n", r"repeat one.*eval/NAME"),
    ("eval:\n  datasets:\n    - {name: a, path: /a, n_samples_per_eval_prompt: two}\n",
     r"`n_samples_per_eval_prompt` is 'two', but it must be of type int"),
    ("eval:\n  datasets:\n    - {name: a, path: /a, max_response_len: 0}\n", r"`max_response_len` is 0, below its least"),
    ("eval:\n  datasets:\n    - {name: a, path: /a, temperature: 0}\n", r"`temperature` is 0.0, but it must be .* > 0"),
    ("eval:\n  datasets:\n    - {name: a, path: '${oc.env:DATA}/a.jsonl'}\n", r"`path` is .*OmegaConf interpolation"),
    ("eval:\n  datasets:\n    - {name: a}\n", r"dataset 'a' has no `path`"),
    ("eval:\n  datasets:\n    - {path: /a}\n", r"has no `name`"),
    ("eval:\n  defaults: {}\n", r"defines no datasets under `eval.datasets`"),
    ("- a\n- b\n", r"the root is not a mapping"),
    ("eval: [unclosed\n", r"is not readable YAML"),
])
def test_a_bad_config_is_one_line_naming_the_file_and_the_key(tmp_path, text, pattern):
    config = _config(tmp_path, text)
    with pytest.raises(MilesConfigError, match=f"^--eval-config {config}") as caught:
        eval_datasets(_args("--eval-config", config))
    assert "\n" not in str(caught.value)
    assert caught.match(pattern)


def test_a_missing_config_file_is_named_with_the_fix(tmp_path):
    with pytest.raises(MilesConfigError, match=r"^--eval-config .*nope.yaml: no such file. Pass the YAML file"):
        eval_datasets(_args("--eval-config", str(tmp_path / "nope.yaml")))


class _StandInEngine:
    """An engine actor's ``generate`` as the manager calls it (``engine.generate.remote``), answering each prompt's
    label (or "x" for a prompt whose text holds "wrong") and recording the request."""

    def __init__(self):
        self.generate = self
        self.calls = []

    def remote(self, prompts, n_samples, temperature, max_response_len, seed, sampling):
        self.calls.append({"prompts": [p["prompt"] for p in prompts], "n": n_samples, "temperature": temperature,
                           "max_response_len": max_response_len, "seed": seed, **sampling})
        samples = []
        for prompt in prompts:
            for _ in range(n_samples):
                response = "x" if "wrong" in prompt["prompt"] else prompt["label"]
                status = SampleStatus.TRUNCATED if len(response) >= max_response_len else SampleStatus.COMPLETED
                samples.append(Sample(group_index=0, index=0, prompt=prompt["prompt"], label=prompt["label"],
                                      tokens=[1, 2], response_length=len(response), response=response,
                                      status=status))
        return samples


def test_each_dataset_is_sampled_with_its_values_and_named_in_the_metrics(tmp_path, monkeypatch):
    monkeypatch.setattr(rollout_manager_module.ray, "get", lambda values: values)
    train = _jsonl(tmp_path / "train.jsonl", [{"prompt": "1+1=", "label": "2"}])
    easy = _jsonl(tmp_path / "easy.jsonl", [{"prompt": "2+2=", "label": "4"}, {"prompt": "3+3=", "label": "6"}])
    mixed = _jsonl(tmp_path / "mixed.jsonl", [{"q": "1+2=", "a": "3"}, {"q": "wrong 5+5=", "a": "10"},
                                              {"q": "wrong 4+4=", "a": "8"}])
    config = _config(tmp_path, f"""
eval:
  defaults: {{max_response_len: 5}}
  datasets:
    - {{name: easy, path: {easy}, n_samples_per_eval_prompt: 2, temperature: 0.5}}
    - {{name: mixed, path: {mixed}, input_key: q, label_key: a, top_k: 3, max_response_len: 2, stop: ["="]}}
""")
    args = _args("--prompt-data", train, "--eval-config", config, "--rollout-batch-size", "1",
                 "--n-samples-per-prompt", "1", "--rollout-temperature", "0.75")
    engine = _StandInEngine()
    metrics = RolloutManager(args, [engine]).evaluate(rollout_id=4)
    easy_call, mixed_call = engine.calls
    assert (easy_call["prompts"], easy_call["n"], easy_call["temperature"], easy_call["max_response_len"],
            easy_call["top_k"], easy_call["stop"]) == (["2+2=", "3+3="], 2, 0.5, 5, -1, [])
    assert (mixed_call["prompts"], mixed_call["n"], mixed_call["temperature"], mixed_call["max_response_len"],
            mixed_call["top_k"], mixed_call["stop"]) == (["1+2=", "wrong 5+5=", "wrong 4+4="], 1, 0.75, 2, 3, ["="])
    assert easy_call["seed"] != mixed_call["seed"]  # each dataset is seeded apart
    # easy: 4 samples, all right, none truncated (1 character < 5). mixed: "3" right; two "x" wrong, each 1 < 2.
    # accuracy over all 7 samples = (4 + 1) / 7; response length = (4·1 + 3·1) / 7 = 1.
    assert metrics == {"eval/easy": 1.0, "eval/easy-truncated_ratio": 0.0,
                       "eval/mixed": pytest.approx(1 / 3), "eval/mixed-truncated_ratio": 0.0,
                       "eval/accuracy": pytest.approx(5 / 7), "eval/num_samples": 7,
                       "eval/response_length_mean": 1.0}


def test_a_single_eval_prompt_data_keeps_mileses_totals_and_adds_upstreams_name(tmp_path, monkeypatch):
    monkeypatch.setattr(rollout_manager_module.ray, "get", lambda values: values)
    data = _jsonl(tmp_path / "eval.jsonl", [{"prompt": "wrong 9+9=", "label": "18"}, {"prompt": "1+1=", "label": "2"}])
    args = _args("--prompt-data", data, "--eval-prompt-data", data, "--rollout-batch-size", "1",
                 "--n-samples-per-prompt", "1", "--eval-max-response-len", "1")
    metrics = RolloutManager(args, [_StandInEngine()]).evaluate(rollout_id=0)
    # "x" and "2": one right of two; both reach the 1-token budget, so both count as truncated
    assert metrics == {"eval/aime": 0.5, "eval/aime-truncated_ratio": 1.0, "eval/accuracy": 0.5,
                       "eval/num_samples": 2, "eval/response_length_mean": 1.0}
