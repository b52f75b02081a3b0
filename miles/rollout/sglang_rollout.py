"""Upstream's import path of the generate helper a custom generate function awaits
(``from miles.rollout.sglang_rollout import generate``); the code is ``miles/rollout/custom_generate.py``."""

from miles.rollout.custom_generate import generate

__all__ = ["generate"]
