"""Reward functions: built-in rule rewards by name (``--rm-type``) or a user function (``--custom-rm-path``).

Every reward function is called as ``fn(prompt: str, response: str, label: str) -> float``, where ``response`` is
the decoded response without special tokens (the engine decodes with ``skip_special_tokens=True``).
``get_reward_fn`` wraps it so that an exception, or a result that is not a finite real number, stops the run
with an error naming the function, the prompt and the response, instead of training on a bad reward.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import re
from collections.abc import Callable
from pathlib import Path

from miles.utils.errors import MilesConfigError

RewardFn = Callable[[str, str, str], float]

# Special-token spellings removed before comparing, in case a caller passes raw decoded text: the embedded
# tokenizer's <pad>/<bos>/<eos>, sentencepiece's <s>/</s>/<unk>, and the <|...|> family (Qwen, Llama 3, GPT).
_SPECIAL_TOKEN = re.compile(r"<\|[^|<>]*\|>|</?s>|<(?:pad|bos|eos|unk)>")


class RewardFunctionError(MilesConfigError):
    """A reward function raised, or returned something that is not a finite real number."""


def math_exact(prompt: str, response: str, label: str) -> float:
    """reward = 1.0 if strip(remove_special_tokens(response)) == strip(label) else 0.0 (the prompt is unused)."""
    return 1.0 if _SPECIAL_TOKEN.sub("", response).strip() == label.strip() else 0.0


BUILTIN_REWARDS: dict[str, RewardFn] = {"math_exact": math_exact}
DEFAULT_RM_TYPE = "math_exact"


def get_reward_fn(rm_type: str = DEFAULT_RM_TYPE, custom_rm_path: str | None = None) -> RewardFn:
    """The checked reward function: ``custom_rm_path`` when given (it overrides ``rm_type``), else the built-in
    named ``rm_type``. Unknown names and unloadable paths are ``MilesConfigError``s listing the fix."""
    if custom_rm_path:
        return CheckedReward(load_custom_reward(custom_rm_path), custom_rm_path)
    if rm_type not in BUILTIN_REWARDS:
        raise MilesConfigError(
            f"--rm-type {rm_type!r} is not a built-in reward; choose one of {sorted(BUILTIN_REWARDS)}, or pass "
            f"--custom-rm-path path/to/file.py:func_name."
        )
    return CheckedReward(BUILTIN_REWARDS[rm_type], f"--rm-type {rm_type}")


class CheckedReward:
    """Calls a reward function and checks its result: a finite real number (bools count as 0/1), as a float."""

    def __init__(self, fn: RewardFn, name: str):
        self.fn = fn
        self.name = name

    def __call__(self, prompt: str, response: str, label: str) -> float:
        where = f"prompt={_short(prompt)}, response={_short(response)}, label={_short(label)}"
        try:
            value = self.fn(prompt, response, label)
        except Exception as exc:
            raise RewardFunctionError(
                f"reward function {self.name} raised {type(exc).__name__}: {exc} for {where}. Fix the function "
                f"so it returns a float for every response (e.g. 0.0 for an unparsable one)."
            ) from exc
        if isinstance(value, numbers.Real) and math.isfinite(float(value)):
            return float(value)
        raise RewardFunctionError(
            f"reward function {self.name} returned {value!r} ({type(value).__name__}) for {where}; a reward must "
            f"be a finite real number (not NaN, inf or a non-number). Fix the function's return value."
        )

    def __repr__(self) -> str:
        return f"CheckedReward({self.name})"


def load_custom_reward(spec: str) -> RewardFn:
    """Load ``path/to/file.py:func_name`` or ``package.module:func_name`` and check it takes 3 arguments."""
    module_part, _, function_name = spec.rpartition(":")
    if not module_part or not function_name:
        raise MilesConfigError(
            f"--custom-rm-path {spec!r} must be 'path/to/file.py:func_name' or 'package.module:func_name'."
        )
    module = _load_module(module_part, spec)
    fn = getattr(module, function_name, None)
    if fn is None or not callable(fn):
        found = "is not callable" if fn is not None else "does not exist"
        raise MilesConfigError(f"--custom-rm-path {spec!r}: {function_name!r} {found} in {module_part!r}.")
    try:
        inspect.signature(fn).bind("prompt", "response", "label")
    except TypeError as exc:
        raise MilesConfigError(
            f"--custom-rm-path {spec!r}: {function_name} cannot be called as {function_name}(prompt, response, "
            f"label) ({exc}); give it those three parameters."
        ) from exc
    except ValueError:
        pass  # some builtins have no introspectable signature; the call itself is checked
    return fn


def _load_module(module_part: str, spec: str):
    is_file = module_part.endswith(".py") or "/" in module_part or "\\" in module_part
    try:
        if not is_file:
            return importlib.import_module(module_part)
        path = Path(module_part).expanduser().resolve()
        if not path.is_file():
            raise MilesConfigError(f"--custom-rm-path {spec!r}: no such file {str(path)!r}.")
        # Not registered in sys.modules: the module stays private, and cloudpickle ships the function by value.
        unique_name = "miles_custom_rm_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
        module_spec = importlib.util.spec_from_file_location(unique_name, path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module
    except MilesConfigError:
        raise
    except Exception as exc:  # the user's module failed to import: show why, with its traceback chained
        raise MilesConfigError(
            f"--custom-rm-path {spec!r}: importing {module_part!r} failed with {type(exc).__name__}: {exc}."
        ) from exc


def _short(text: str, limit: int = 200) -> str:
    text = repr(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
