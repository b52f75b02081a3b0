"""Upstream's class form of a generate function (upstream's import path): ``async def generate(input:
GenerateFnInput) -> GenerateFnOutput``, beside the legacy ``(args, sample, sampling_params[, evaluation])`` form
(``miles.rollout.custom_generate`` calls either)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from miles.rollout.generate_api import GenerateState
from miles.utils.types import Sample


@dataclass(frozen=True)
class GenerateFnInput:
    state: GenerateState
    sample: Sample
    sampling_params: dict[str, Any]
    evaluation: bool

    @property
    def args(self):
        return self.state.args


@dataclass(frozen=True)
class GenerateFnOutput:
    samples: Sample | list[Sample]  # one sample per call in miles (a list is refused: docs/rollout.md)
