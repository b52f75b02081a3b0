"""Loading Hugging Face folders: one place for the causal LM, the critic and the tokenizer, all local and fp32.

The rollout engine, the trainer and the embedded default's builder all load through here, so the engine and the
trainer compute log-probs with the same model class, dtype and attention implementation.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
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


def load_causal_lm(hf_checkpoint: str) -> torch.nn.Module:
    """The HF causal LM in ``hf_checkpoint``, fp32, eval mode, from local files only."""
    return _load_model(AutoModelForCausalLM, hf_checkpoint, "a causal LM").eval()


def load_value_model(hf_checkpoint: str) -> torch.nn.Module:
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
            AutoModelForTokenClassification, hf_checkpoint, "a critic", num_labels=1, classifier_dropout=0.0
        )
    finally:
        transformers_logging.set_verbosity(verbosity)


def check_hf_checkpoint(hf_checkpoint: str) -> Path:
    """The folder, or a clear error for a missing one or one without config.json (before any process starts)."""
    folder = Path(hf_checkpoint).expanduser()
    if not folder.is_dir():
        raise MilesConfigError(
            f"--hf-checkpoint {hf_checkpoint!r}: no such folder. Pass a local Hugging Face causal-LM folder "
            f"(config.json + weights + tokenizer), or leave the flag out to use the embedded default."
        )
    if not (folder / "config.json").is_file():
        raise MilesConfigError(
            f"--hf-checkpoint {hf_checkpoint!r}: the folder has no config.json, so it is not a Hugging Face model "
            f"folder. Pass a folder written by save_pretrained(), or leave the flag out to use the embedded default."
        )
    return folder


def _load_model(auto_class, hf_checkpoint: str, what: str, **config_overrides) -> torch.nn.Module:
    folder = check_hf_checkpoint(hf_checkpoint)
    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
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
