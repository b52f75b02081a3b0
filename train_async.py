"""Asynchronous RL training: generate rollout k+1 while training on rollout k.

The data each step trains on is one or more weight versions stale, so async PPO must name how its ratio
denominator is corrected (docs/async_off_policy_contract.md); the first statements of ``train`` enforce that,
before logging, Ray, models or files are touched.
"""

import asyncio

from miles.utils.arguments import (
    check_async_colocation,
    parse_args,
    validate_async_off_policy_correction,
)
from miles.utils.cli import run_cli
from miles.utils.logging_utils import configure_logging


async def train(args) -> None:
    check_async_colocation(args)
    validate_async_off_policy_correction(args)
    configure_logging(args)
    from miles.ray.run import (
        training_run,  # torch, ray, transformers: only once the launch is known valid
    )

    with training_run(args, driver="train_async") as run:
        next_rollout = run.generate(run.start_rollout_id)
        for rollout_id in run.rollout_ids():
            rollout_ref, rollout_metrics_ref = next_rollout
            # Start the next rollout before training on this one: the overlap that makes the data stale.
            next_rollout = run.generate(rollout_id + 1) if rollout_id + 1 < args.num_rollout else None
            train_metrics = await asyncio.gather(*run.train(rollout_id, rollout_ref))
            if (rollout_id + 1) % args.update_weights_interval == 0:
                if next_rollout is not None:
                    await next_rollout[1]  # drain: no weight push lands in the middle of a generation
                await run.update_weights(rollouts_trained=rollout_id + 1)
            run.finish_rollout(rollout_id, [await rollout_metrics_ref, *train_metrics])
            if run.should_stop(rollout_id):
                break


if __name__ == "__main__":
    run_cli(lambda: asyncio.run(train(parse_args())))
