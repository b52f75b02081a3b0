"""Synchronous RL training: generate a rollout, train on it, push the weights, repeat (never stale)."""

from miles.utils.arguments import parse_args
from miles.utils.cli import run_cli
from miles.utils.logging_utils import configure_logging


def train(args) -> None:
    configure_logging(args)
    from miles.ray.run import (
        training_run,  # torch, ray, transformers: only once the launch is known valid
    )

    with training_run(args, driver="train") as run:
        for rollout_id in run.rollout_ids():
            rollout_ref, rollout_metrics_ref = run.generate(rollout_id)
            train_metrics = run.wait(run.train(rollout_id, rollout_ref))
            run.wait(run.update_weights(rollouts_trained=rollout_id + 1))
            run.finish_rollout(rollout_id, [run.wait(rollout_metrics_ref), *train_metrics])
            if run.should_stop(rollout_id):
                break


if __name__ == "__main__":
    run_cli(lambda: train(parse_args()))
