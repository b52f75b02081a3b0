"""The rollout engine interface, and the engine of each ``--rollout-backend`` (docs/design.md §6).

``RolloutEngine`` is what the run and the ``RolloutManager`` call on an engine, through its actor shell
(``engine_actor.py``); the torch engine (``engine.py``) and SGLang (``sglang_engine.py``) implement it, and the
backend is chosen once, here (``engine_class``). Torch-free: the rollout manager's process imports it.
"""

from __future__ import annotations

import importlib
import inspect
from typing import ClassVar, Protocol

# --rollout-backend -> "module:class" (imported only when chosen: the torch engine needs torch, SGLang its package)
ENGINES = {"torch": "miles.rollout.engine:TorchRolloutEngine",
           "sglang": "miles.rollout.sglang_engine:SGLangRolloutEngine"}


class RolloutEngine(Protocol):
    """One rollout engine: loads the trainer's pushes and generates samples stamped with the version it holds."""

    # The run waits for ``ready()`` (up to --rollout-engine-start-timeout) before the train processes start: for an
    # engine whose start is slow and may fail (SGLang's, about 30 s here); the others start beside the trainers.
    waits_for_start: ClassVar[bool]

    @classmethod
    def preflight(cls, args) -> None:
        """Check (and complete on ``args``) the engine's own settings in the driver, before Ray starts."""

    @classmethod
    def check_prompt_capacity(cls, args, prompt_ids: list[list[int]]) -> None:
        """Refuse, in the preflight, tokenized prompts whose responses the engine would cut short silently."""

    @classmethod
    def init_args(cls, args, index: int) -> tuple:
        """The constructor's arguments for engine ``index`` of the run."""

    def ready(self) -> str:
        """Returns (the engine's name) once it has started."""

    def load_pushed(self, payload: dict) -> tuple[int, str, str]:
        """Load the push ``{"version", "fingerprint", "state_dict"}``; return the version, the trainer's fingerprint
        and that of the weights the engine now holds."""

    def push_perf(self) -> dict[str, float]:
        """The latest push's cost inside the engine, as ``perf/*`` metrics (empty when there is nothing to add)."""

    def generate(self, prompts: list[dict], n_samples_per_prompt: int, temperature: float, max_response_len: int,
                 seed: int) -> list:
        """``n_samples_per_prompt`` samples of each prompt, each with its rollout log-probs and weight version."""


# The verbs the actor shell forwards: the protocol's instance methods, and ``shutdown`` for an engine with processes
# of its own (the run calls it, when present, before Ray shuts down).
ENGINE_VERBS = (*(name for name, member in vars(RolloutEngine).items()
                  if inspect.isfunction(member) and not name.startswith("_")), "shutdown")


def engine_class(rollout_backend: str) -> type:
    """The engine class of ``--rollout-backend`` (imports its module: torch, and SGLang for ``sglang``)."""
    module_name, _, class_name = ENGINES[rollout_backend].partition(":")
    return getattr(importlib.import_module(module_name), class_name)
