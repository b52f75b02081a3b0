"""Loading Hugging Face folders: one place for the causal LM, the critic and the tokenizer, all local and fp32.

The rollout engine, both training backends and the embedded default's builder all load through here, so the
engine and the trainer compute log-probs with the same model class, dtype and attention implementation.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as transformers_logging

from miles.utils.errors import MilesConfigError

# tokenizer_config.json classes that mean "the tokenizer.json is the whole tokenizer" (transformers 4 and 5
# names). AutoTokenizer would reload such a folder as the model type's tokenizer, with its own pre-tokenizer.
_PLAIN_FAST_TOKENIZER_CLASSES = {"PreTrainedTokenizerFast", "TokenizersBackend"}


# The config fields of each dropout of --attention-dropout / --hidden-dropout, as Hugging Face model families name them.
DROPOUT_FIELDS = {
    "--attention-dropout": ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob"),
    "--hidden-dropout": ("hidden_dropout", "hidden_dropout_prob", "resid_pdrop"),
}


def dropout_overrides(config: dict, attention_dropout: float = 0.0, hidden_dropout: float = 0.0) -> dict:
    """The config fields that set the two dropouts to the flags' values (every field of each the model has). A
    nonzero dropout the model has no field for is a ``MilesConfigError``: it would be accepted and ignored."""
    overrides = {}
    for (flag, fields), value in zip(DROPOUT_FIELDS.items(), (attention_dropout, hidden_dropout), strict=True):
        present = [field for field in fields if field in config]
        if value and not present:
            raise MilesConfigError(
                f"{flag} {value}: the checkpoint's model ({config.get('model_type', 'unknown type')}) has no such "
                f"dropout (its config.json has none of {', '.join(fields)}), so the value would be ignored. Pass "
                f"{flag} 0, or a model with that dropout."
            )
        overrides.update(dict.fromkeys(present, value))
    return overrides


def load_causal_lm(hf_checkpoint: str, **dropout) -> torch.nn.Module:
    """The HF causal LM in ``hf_checkpoint``, fp32, eval mode, from local files only; ``dropout``: the keywords of
    ``dropout_overrides`` (the config's own dropout otherwise)."""
    return _load_model(AutoModelForCausalLM, hf_checkpoint, "a causal LM", dropout=dropout).eval()


def load_value_model(hf_checkpoint: str, **dropout) -> torch.nn.Module:
    """A critic: the same backbone with a one-output token-classification head (HF's ``score`` layer), fp32.

    From a causal-LM folder the head is new (initialized by transformers); from a saved critic it is loaded.
    Either way the model saves and loads with the ordinary HF functions. The head's dropout (transformers'
    default 0.1) is off: the value targets and the clipped "old" values are taken without dropout, so the
    trained values must be too, and both training backends then compute the same critic.
    """
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # "newly initialized weights: score" is expected for a new critic
    try:
        return _load_model(
            AutoModelForTokenClassification, hf_checkpoint, "a critic", dropout=dropout, num_labels=1,
            classifier_dropout=0.0,
        )
    finally:
        transformers_logging.set_verbosity(verbosity)


def load_role_model(role: str, hf_checkpoint: str, **dropout) -> torch.nn.Module:
    """The model a train role starts from: the critic for ``"critic"``, the causal LM for any other role."""
    return (load_value_model if role == "critic" else load_causal_lm)(hf_checkpoint, **dropout)


HF_CHECKPOINT_FIX = (
    "Pass a local Hugging Face causal-LM folder written by save_pretrained() (config.json + weights + tokenizer), "
    "or leave the flag out to use the embedded default."
)
SAFETENSORS_INDEX = "model.safetensors.index.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def check_hf_checkpoint(hf_checkpoint: str, flag: str = "--hf-checkpoint", fix: str = HF_CHECKPOINT_FIX) -> Path:
    """The folder, or one clear error for a missing folder, a missing config.json, or weights that are missing or
    incomplete (read from the safetensors headers, without loading a tensor), before any process starts."""
    folder = Path(hf_checkpoint).expanduser()
    problem = _hf_folder_problem(folder)
    if problem is not None:
        raise MilesConfigError(f"{flag} {hf_checkpoint!r}: {problem}. {fix}")
    return folder


def _hf_folder_problem(folder: Path) -> str | None:
    """What keeps ``folder`` from loading as a Hugging Face model, in a few words; ``None`` when nothing does."""
    if not folder.is_dir():
        return "no such folder" if not folder.exists() else "a file, not a folder"
    if not (folder / "config.json").is_file():
        return "the folder has no config.json, so it is not a Hugging Face model folder"
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return f"{SAFETENSORS_INDEX} is not a valid index ({exc!r})"
        return next(filter(None, (_safetensors_problem(folder / shard) for shard in shards)), None)
    if (folder / "model.safetensors").is_file():
        return _safetensors_problem(folder / "model.safetensors")
    if (folder / "pytorch_model.bin").is_file():
        return None  # a pickle has no header to check without reading it all; transformers reports a bad one
    return f"the folder has no weights ({' or '.join(WEIGHT_FILES + (SAFETENSORS_INDEX,))})"


def weight_names(folder: Path) -> set[str]:
    """The names of the checkpoint's tensors (from the safetensors index or headers; a pickle is memory-mapped),
    without loading a tensor. ``folder`` passed ``check_hf_checkpoint``."""
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        return set(json.loads(index.read_text())["weight_map"])
    if (folder / "model.safetensors").is_file():
        with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
            return set(weights.keys())
    return set(torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True, mmap=True))


def _safetensors_problem(path: Path) -> str | None:
    """safetensors checks the header and that the file is as long as the header says: a truncated or damaged file
    fails here, in about a millisecond, instead of in a train actor's __init__."""
    if not path.is_file():
        return f"its weights file {path.name} is missing"
    try:
        with safe_open(str(path), framework="pt"):
            return None
    except (SafetensorError, OSError) as exc:
        return f"its weights file {path.name} is truncated or damaged ({exc})"


def _load_model(auto_class, hf_checkpoint: str, what: str, dropout: dict, **config_overrides) -> torch.nn.Module:
    folder = check_hf_checkpoint(hf_checkpoint)
    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        if dropout:
            config_overrides.update(dropout_overrides(config.to_dict(), **dropout))
        for name, value in config_overrides.items():  # set, not passed: from_pretrained drops unknown config keys
            setattr(config, name, value)
        with quiet_transformers_progress():
            model = auto_class.from_pretrained(str(folder), config=config, dtype=torch.float32, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise MilesConfigError(
            f"--hf-checkpoint {hf_checkpoint!r}: transformers cannot load {what} from it ({exc}). Pass a folder "
            f"written by save_pretrained() of a causal LM, or leave the flag out to use the embedded default."
        ) from exc
    return model.to(torch.float32)


def load_tokenizer(hf_checkpoint: str):
    """The folder's tokenizer: ``PreTrainedTokenizerFast`` when it was saved as a plain ``tokenizers`` tokenizer
    (as the embedded default is), else whatever ``AutoTokenizer`` picks for the model."""
    folder = Path(hf_checkpoint).expanduser()
    config_path = folder / "tokenizer_config.json"
    saved_class = json.loads(config_path.read_text()).get("tokenizer_class") if config_path.is_file() else None
    try:
        if saved_class in _PLAIN_FAST_TOKENIZER_CLASSES and (folder / "tokenizer.json").is_file():
            return PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise MilesConfigError(
            f"--hf-checkpoint {hf_checkpoint!r}: no usable tokenizer in the folder ({exc}). Save the tokenizer "
            f"beside the model with tokenizer.save_pretrained(folder)."
        ) from exc


@contextlib.contextmanager
def quiet_transformers_progress() -> Iterator[None]:
    """Hide transformers' per-load progress bars (they would interleave with the training bar), then restore."""
    was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            transformers_logging.enable_progress_bar()
