"""Asynchronous RL training: generate rollout k+1 while training on rollout k.

The data each step trains on is one or more weight versions stale, so async PPO must name how its ratio
denominator is corrected (docs/async_off_policy_contract.md); the first statements of ``train`` enforce that,
before logging, Ray, models or files are touched.
"""

import asyncio

from miles.utils.arguments import check_async_colocation, parse_args, validate_async_off_policy_correction
from miles.utils.cli import run_cli
from miles.utils.logging_utils import configure_logging

TRAINING_NOT_BUILT = (
    "The launch is valid, but training is not built yet: the training stack (Ray, models, rollout engines, "
    "the loop) arrives with the issue 'A real training stack on CPU'."
)


async def train(args) -> None:
    check_async_colocation(args)
    validate_async_off_policy_correction(args)
    configure_logging(args)
    # Hand-over point: the issue "A real training stack on CPU" replaces this with the async loop.
    raise SystemExit(TRAINING_NOT_BUILT)


if __name__ == "__main__":
    run_cli(lambda: asyncio.run(train(parse_args())))
