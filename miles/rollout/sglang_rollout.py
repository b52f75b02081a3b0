"""Upstream's legacy generate module (its import path): ``GenerateState``, ``generate(args, sample,
sampling_params)`` (one ``/generate`` call through the router: ``generate_hub.single_turn.legacy_generate``) and
``get_model_url``. A custom generate function imports these as it does upstream (docs/rollout.md)."""

from miles.rollout.generate_api import GenerateState, get_model_url
from miles.rollout.generate_hub.single_turn import legacy_generate

generate = legacy_generate

__all__ = ["GenerateState", "generate", "get_model_url"]
