"""Reward functions: built-in rule rewards by name (``--rm-type``) or a user function (``--custom-rm-path``).

Two forms, told apart by the path's spelling:
- miles' own, ``path/to/file.py:func`` or ``package.module:func`` (a colon), and the built-ins: called as
  ``fn(prompt: str, response: str, label: str) -> float``, with a label that is not a string (a number, an object)
  passed as its JSON text;
- upstream's, ``package.module.func`` (dots only): ``async def reward_func(args, sample, **kwargs) -> float``,
  awaited, with the ``Sample`` as the rollout made it (``sample.label`` the dataset's value: an object stays a
  dict, so ``sample.label["ground_truth"]`` works as upstream). A plain function that returns a number works too.
``response`` is the decoded response without special tokens (the engine decodes with ``skip_special_tokens=True``).
``get_reward_fn`` wraps either so that an exception, or a result that is not a finite real number, stops the run
with an error naming the function, the prompt and the response, instead of training on a bad reward; ``score``
rewards a rollout's samples, awaiting an async function's results together in one event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import json
import math
import numbers
import re
from collections.abc import Callable
from pathlib import Path

from miles.config.hooks import load_function
from miles.utils.async_utils import run
from miles.utils.errors import MilesConfigError
from miles.utils.types import Sample

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


def get_reward_fn(rm_type: str = DEFAULT_RM_TYPE, custom_rm_path: str | None = None) -> CheckedReward:
    """The checked reward function: ``custom_rm_path`` when given (it overrides ``rm_type``), else the built-in
    named ``rm_type``. Unknown names and unloadable paths are ``MilesConfigError``s listing the fix."""
    if custom_rm_path and _is_upstream_form(custom_rm_path):
        return UpstreamReward(load_upstream_reward(custom_rm_path), custom_rm_path)
    if custom_rm_path:
        return CheckedReward(load_custom_reward(custom_rm_path), custom_rm_path)
    if rm_type not in BUILTIN_REWARDS:
        raise MilesConfigError(
            f"--rm-type {rm_type!r} is not a built-in reward; choose one of {sorted(BUILTIN_REWARDS)}, or pass "
            f"--custom-rm-path path/to/file.py:func_name (or upstream's package.module.reward_func)."
        )
    return CheckedReward(BUILTIN_REWARDS[rm_type], f"--rm-type {rm_type}")


def label_text(label) -> str:
    """The label as miles' (prompt, response, label) form receives it: a string as it is, any other JSON value as
    its JSON text (7 -> "7")."""
    return label if isinstance(label, str) else json.dumps(label)


class CheckedReward:
    """Calls a ``(prompt, response, label)`` reward function and checks its result: a finite real number (bools
    count as 0/1), as a float."""

    def __init__(self, fn: RewardFn, name: str):
        self.fn = fn
        self.name = name

    def __call__(self, prompt: str, response: str, label: str) -> float:
        context = (prompt, response, label)  # named in an error only, so formatted only then
        try:
            value = self.fn(prompt, response, label)
        except Exception as exc:
            raise _raised(self.name, exc, context) from exc
        return _checked(value, self.name, context)

    def score(self, args, samples: list[Sample]) -> list[float]:
        """The reward of each sample, in order."""
        return [self(sample.prompt, sample.response, label_text(sample.label)) for sample in samples]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class UpstreamReward(CheckedReward):
    """Upstream's form, ``reward_func(args, sample)``: every sample's call is made, the awaitable results awaited
    together in one event loop (as upstream gathers them), and each result checked."""

    def __call__(self, args, sample: Sample) -> float:  # upstream's call shape, not the (prompt, response, label) one
        return self.score(args, [sample])[0]

    def score(self, args, samples: list[Sample]) -> list[float]:
        contexts = [(sample.prompt, sample.response, sample.label) for sample in samples]
        results = []
        for sample, context in zip(samples, contexts, strict=True):
            try:
                results.append(self.fn(args, sample))
            except Exception as exc:
                raise _raised(self.name, exc, context) from exc
        pending = [index for index, result in enumerate(results) if inspect.isawaitable(result)]
        if pending:
            awaited = run(_gather([results[index] for index in pending]))  # the process's loop: http_utils' client
            for index, value in zip(pending, awaited, strict=True):
                if isinstance(value, BaseException):
                    raise _raised(self.name, value, contexts[index]) from value
                results[index] = value
        return [_checked(value, self.name, context) for value, context in zip(results, contexts, strict=True)]


async def _gather(awaitables: list):
    return await asyncio.gather(*awaitables, return_exceptions=True)


def _where(context: tuple) -> str:
    """The (prompt, response, label) a reward was asked for, shortened, for an error."""
    prompt, response, label = context
    return f"prompt={_short(prompt)}, response={_short(response)}, label={_short(label)}"


def _raised(name: str, exc: BaseException, context: tuple) -> RewardFunctionError:
    return RewardFunctionError(
        f"reward function {name} raised {type(exc).__name__}: {exc} for {_where(context)}. Fix the function so it "
        f"returns a float for every response (e.g. 0.0 for an unparsable one).")


def _checked(value, name: str, context: tuple) -> float:
    if isinstance(value, numbers.Real) and math.isfinite(float(value)):
        return float(value)
    raise RewardFunctionError(
        f"reward function {name} returned {value!r} ({type(value).__name__}) for {_where(context)}; a reward must be "
        f"a finite real number (not NaN, inf or a non-number). Fix the function's return value."
    )


def _is_upstream_form(spec: str) -> bool:
    """A dotted path (no colon, not a file path) names upstream's ``reward_func(args, sample)``."""
    return ":" not in spec and not (spec.endswith(".py") or "/" in spec or "\\" in spec)


def load_upstream_reward(spec: str) -> Callable:
    """Upstream's ``--custom-rm-path package.module.reward_func``, checked to take ``(args, sample)``."""
    fn = load_function("--custom-rm-path", spec, "examples.custom_generate.reward.reward_func")
    try:
        inspect.signature(fn).bind("args", "sample")
    except TypeError as exc:
        raise MilesConfigError(
            f"--custom-rm-path {spec!r}: a dotted path names upstream's form, async def {fn.__name__}(args, sample, "
            f"**kwargs), but it cannot be called so ({exc}). Give it those parameters, or name a (prompt, response, "
            f"label) function with a colon: package.module:{fn.__name__}."
        ) from exc
    except ValueError:
        pass  # no introspectable signature; the call itself is checked
    return fn


def load_custom_reward(spec: str) -> RewardFn:
    """Load ``path/to/file.py:func_name`` or ``package.module:func_name`` and check it takes 3 arguments."""
    module_part, _, function_name = spec.rpartition(":")
    if not module_part or not function_name:
        raise MilesConfigError(
            f"--custom-rm-path {spec!r} must be 'path/to/file.py:func_name' or 'package.module:func_name' (or "
            f"upstream's dotted 'package.module.func_name', called as func(args, sample))."
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


def _short(text, limit: int = 200) -> str:
    text = repr(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
