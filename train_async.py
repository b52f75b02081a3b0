"""Asynchronous RL training: generate rollout k+1 while training on rollout k.

The data each step trains on is one or more weight versions stale, so async PPO must name how its ratio
denominator is corrected (docs/async_off_policy_contract.md); the first statements of ``train`` enforce that,
before logging, Ray, models or files are touched. At run time the actor guards every rollout against the
staleness this loop's order implies (``expected_staleness``).
"""

from miles.utils.arguments import (
    async_staleness_warning,
    check_async_colocation,
    check_async_max_weight_staleness,
    parse_args,
    validate_async_off_policy_correction,
)
from miles.utils.cli import run_cli
from miles.utils.logging_utils import configure_logging


async def train(args) -> None:
    validate_async_off_policy_correction(args)
    check_async_colocation(args)
    check_async_max_weight_staleness(args)
    logger = configure_logging(args)
    if warning := async_staleness_warning(args):
        logger.warning(warning)
    # torch, ray and transformers are imported only once the launch is known to be valid.
    from miles.guard.off_policy import expected_staleness
    from miles.ray.run import training_run

    with training_run(args, driver="train_async") as run:
        next_rollout, push = run.generate(run.start_rollout_id), None
        for rollout_id in run.rollout_ids():
            rollout_ref, rollout_metrics_ref = next_rollout
            # Start the next rollout before training on this one: the overlap that makes the data stale.
            next_rollout = run.generate(rollout_id + 1) if rollout_id + 1 < args.num_rollout else None
            staleness = expected_staleness(rollout_id, args.update_weights_interval, run.staleness_origin)
            train_refs = run.train(rollout_id, rollout_ref, staleness)
            if (rollout_id + 1) % args.update_weights_interval == 0:
                await run.settled(push)
                # Submitted now and not awaited: Ray runs one caller's calls to an actor in order, so the actor
                # exports right after this rollout's training, and the engines load the push after the in-flight
                # generation (drained: no push lands in the middle of one) and before the next.
                push = run.update_weights(rollouts_trained=rollout_id + 1)
            train_metrics = [await ref for ref in train_refs]  # in order: a failed guard is reported as itself
            run.finish_rollout(rollout_id, [await rollout_metrics_ref, *train_metrics])
            if run.should_stop(rollout_id):
                break
        await run.settled(push)


def main() -> None:
    args = parse_args()
    # The contract is checked here as well, before asyncio and the runtime are imported, so a refused launch costs
    # little more than starting Python (docs/benchmarks.md); train checks again for the callers that run it directly.
    validate_async_off_policy_correction(args)
    import asyncio

    asyncio.run(train(args))


if __name__ == "__main__":
    run_cli(main)
