"""The evaluation datasets: upstream's ``--eval-config FILE.yaml`` or ``--eval-prompt-data NAME PATH [NAME PATH ...]``.

Upstream's format (``miles/utils/eval_config.py``, read by its ``_resolve_eval_datasets``): the root mapping, or
its ``eval`` mapping, holds ``datasets`` (a list of mappings with ``name``, or a mapping keyed by name) and
optional ``defaults``. Each field of a dataset is its own value, else the one under ``defaults``, else the
launch's (``--n-samples-per-eval-prompt``, ``--eval-temperature``, ``--eval-top-p``, ``--eval-top-k``,
``--eval-max-response-len``, each already filled from the rollout's by ``miles_validate_args``; ``--input-key``,
``--label-key``, ``--rm-type``, ``--rollout-stop``, ``--rollout-stop-token-ids``). ``--eval-config`` overrides
``--eval-prompt-data``; a single ``--eval-prompt-data PATH`` is upstream's legacy form, named ``aime``.

Departures (docs/training.md, "Evaluation datasets"): the file is read as plain YAML (upstream's OmegaConf also
resolves ``${...}`` interpolations; a value holding one is refused here, not read as text), ``stop`` and
``stop_token_ids`` act (upstream's dataclass takes them and its eval ignores them), and upstream's keys that
need what miles lacks are refused naming the key. A key neither knows is refused too, with the valid ones.
Torch-free: the rollout manager and the preflight both read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

from miles.utils.errors import MilesConfigError
from miles.utils.types import SampleStatus

LEGACY_NAME = "aime"  # upstream's name for a single --eval-prompt-data PATH
EMBEDDED_EVAL_NAME = "addition"  # the embedded task's eval split, when miles fills --eval-prompt-data
DOCS = "docs/training.md#evaluation-datasets"

# upstream's dataset keys that need what miles does not have, and why
REFUSED_KEYS = {
    "tool_key": "tool schemas for the chat template are not implemented in miles yet",
    "metadata_key": "per-prompt metadata is not implemented in miles yet",
    "metadata_overrides": "per-prompt metadata is not implemented in miles yet",
    "min_new_tokens": "a minimum response length is not implemented in miles' engines yet",
    "custom_generate_function_path": "a per-dataset generate function is not implemented in miles yet",
}


@dataclass(frozen=True)
class EvalDataset:
    """One evaluation dataset with every field resolved (none is None but ``label_key`` and the stops)."""

    name: str
    path: str
    rm_type: str
    input_key: str
    label_key: str | None
    n_samples_per_eval_prompt: int
    temperature: float
    top_p: float
    top_k: int
    max_response_len: int
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()


KEYS = tuple(f.name for f in fields(EvalDataset))
# the field's value when neither the dataset nor ``defaults`` sets it: the launch's flag (its dest), or the first of
# several that is set (upstream's order: --eval-input-key, then --input-key)
FROM_ARGS = {"rm_type": "rm_type", "input_key": ("eval_input_key", "input_key"),
             "label_key": ("eval_label_key", "label_key"),
             "n_samples_per_eval_prompt": "n_samples_per_eval_prompt", "temperature": "eval_temperature",
             "top_p": "eval_top_p", "top_k": "eval_top_k", "max_response_len": "eval_max_response_len",
             "stop": "rollout_stop", "stop_token_ids": "rollout_stop_token_ids"}
TYPES = {"n_samples_per_eval_prompt": int, "top_k": int, "max_response_len": int, "temperature": float,
         "top_p": float, "name": str, "path": str, "rm_type": str, "input_key": str, "label_key": str}
LOW = {"n_samples_per_eval_prompt": 1, "max_response_len": 1}


def eval_datasets(args) -> list[EvalDataset]:
    """The launch's evaluation datasets, in order; [] without --eval-config and --eval-prompt-data."""
    if args.eval_config:
        raw, defaults = read_eval_config(args.eval_config)
        source = f"--eval-config {args.eval_config}"
    elif args.eval_prompt_data:
        raw, defaults, source = name_path_pairs(args.eval_prompt_data), {}, "--eval-prompt-data"
    else:
        return []
    datasets = [resolve_dataset(args, entry, defaults, source) for entry in raw]
    names = [dataset.name for dataset in datasets]
    if len(set(names)) != len(names):
        raise MilesConfigError(f"{source}: the dataset names {names} repeat one, but each names its metrics "
                               "(eval/NAME): give each dataset its own name.")
    return datasets


def name_path_pairs(values: list[str]) -> list[dict]:
    """``--eval-prompt-data NAME PATH [NAME PATH ...]``, or one PATH (upstream names it ``aime``)."""
    values = list(values)
    if len(values) == 1:
        values = [LEGACY_NAME, values[0]]
    if len(values) % 2:
        raise MilesConfigError(
            f"--eval-prompt-data {' '.join(values)}: {len(values)} words, but it takes one PATH or NAME PATH pairs. "
            "Pass e.g. --eval-prompt-data gsm8k /data/gsm8k.jsonl aime /data/aime.jsonl.")
    return [{"name": values[i], "path": values[i + 1]} for i in range(0, len(values), 2)]


def read_eval_config(path: str) -> tuple[list[dict], dict]:
    """The (datasets, defaults) of an eval config file, in upstream's layout."""
    import yaml  # pyyaml, a dependency; only where the flag is set

    file = Path(path)
    if not file.is_file():
        raise MilesConfigError(f"--eval-config {path}: no such file. Pass the YAML file that lists the evaluation "
                               f"datasets ({DOCS}).")
    try:
        root = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise MilesConfigError(f"--eval-config {path} is not readable YAML ({' '.join(str(error).split())}). "
                               "Fix the file.") from None
    where = f"--eval-config {path}"
    section = root.get("eval", root) if isinstance(root, dict) else None
    if not isinstance(section, dict):
        raise MilesConfigError(f"{where}: the root is not a mapping; write `eval: {{datasets: [...]}}` ({DOCS}).")
    defaults = section.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise MilesConfigError(f"{where}: `defaults` is a {type(defaults).__name__}; make it a mapping of keys.")
    listed = section.get("datasets")
    if isinstance(listed, dict):  # keyed by name
        listed = [{"name": name, **(entry or {})} for name, entry in listed.items()]
    if not isinstance(listed, list) or not listed:
        raise MilesConfigError(f"{where} defines no datasets under `eval.datasets`; list them there, each with "
                               f"`name` and `path` ({DOCS}).")
    for entry in listed:
        if not isinstance(entry, dict) or "name" not in entry:
            raise MilesConfigError(f"{where}: the dataset entry {entry!r} has no `name`; give each entry a `name` "
                                   "and a `path`.")
    _check_keys(f"{where} `defaults`", defaults, set(KEYS) - {"name", "path"})
    return listed, defaults


def resolve_dataset(args, entry: dict, defaults: dict, source: str) -> EvalDataset:
    """One dataset's fields: its own, else ``defaults``', else the launch's flag (``FROM_ARGS``)."""
    where = f"{source} dataset {entry.get('name')!r}"
    _check_keys(where, entry, set(KEYS))
    if "path" not in entry:
        raise MilesConfigError(f"{where} has no `path`; give the JSONL file of its prompts.")
    values = {}
    for key in KEYS:
        value = entry.get(key, defaults.get(key))
        if value is None and key in FROM_ARGS:
            dests = FROM_ARGS[key] if isinstance(FROM_ARGS[key], tuple) else (FROM_ARGS[key],)
            value = next((getattr(args, dest) for dest in dests if getattr(args, dest) is not None), None)
        values[key] = _checked(where, key, value)
    return EvalDataset(**values)


def _check_keys(where: str, mapping: dict, valid: set[str]) -> None:
    for key in mapping:
        if key in REFUSED_KEYS:
            raise MilesConfigError(f"{where}: the key `{key}` is upstream's, but {REFUSED_KEYS[key]}. Drop it "
                                   f"({DOCS}).")
        if key not in valid:
            raise MilesConfigError(f"{where}: unknown key `{key}`; the keys are {', '.join(sorted(valid))} "
                                   f"({DOCS}).")


def _checked(where: str, key: str, value):
    if key in ("stop", "stop_token_ids"):
        items = [value] if isinstance(value, (str, int)) else list(value or ())
        kind = str if key == "stop" else int
        if not all(isinstance(item, kind) and not isinstance(item, bool) for item in items):
            raise MilesConfigError(f"{where}: `{key}` is {value!r}; give a list of {kind.__name__}s.")
        return tuple(items)
    if value is None:
        return None
    kind = TYPES[key]
    if isinstance(value, str) and "${" in value:
        raise MilesConfigError(f"{where}: `{key}` is {value!r}, an OmegaConf interpolation, which miles reads as "
                               "plain YAML; write the value itself.")
    ok = isinstance(value, kind) or (kind is float and isinstance(value, int))
    if not ok or isinstance(value, bool):
        raise MilesConfigError(f"{where}: `{key}` is {value!r}, but it must be of type {kind.__name__}.")
    value = kind(value)
    if key in LOW and value < LOW[key]:
        raise MilesConfigError(f"{where}: `{key}` is {value!r}, below its least value {LOW[key]}.")
    if key == "temperature" and not (math.isfinite(value) and value > 0):
        raise MilesConfigError(f"{where}: `temperature` is {value!r}, but it must be a finite number > 0 (the "
                               "log-probs are taken under it, as --eval-temperature's).")
    return value


def dataset_flag(args, dataset: EvalDataset) -> str:
    """How an error about a dataset's prompt file names where it came from."""
    return f"--eval-config {args.eval_config} dataset {dataset.name!r}" if args.eval_config else "--eval-prompt-data"


def load_eval_sets(args, datasets: list[EvalDataset]) -> list[tuple[EvalDataset, list[dict]]]:
    """Each dataset with its prompts, read with its own input and label keys."""
    from miles.rollout.data_source import load_prompts

    return [(dataset, load_prompts(args, dataset.path, dataset_flag(args, dataset),
                                   keys=(dataset.input_key, dataset.label_key))) for dataset in datasets]


def eval_metrics(results: list[tuple[str, list]]) -> dict[str, float]:
    """Upstream's per-dataset names, ``eval/NAME`` (the mean reward) and ``eval/NAME-truncated_ratio``, beside
    miles' totals over every dataset's samples (``eval/accuracy``, ``eval/num_samples``,
    ``eval/response_length_mean``: with one dataset, what miles always logged)."""
    metrics: dict[str, float] = {}
    every = [sample for _, samples in results for sample in samples]
    for name, samples in results:
        metrics[f"eval/{name}"] = sum(s.reward for s in samples) / len(samples)
        metrics[f"eval/{name}-truncated_ratio"] = sum(s.status == SampleStatus.TRUNCATED for s in samples) / len(samples)
    metrics["eval/accuracy"] = sum(s.reward for s in every) / len(every)
    metrics["eval/num_samples"] = len(every)
    metrics["eval/response_length_mean"] = sum(s.response_length for s in every) / len(every)
    return metrics
