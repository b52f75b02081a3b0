"""Synchronous RL training: generate a rollout, train on it, push the weights, repeat (never stale)."""

from miles.utils.arguments import parse_args
from miles.utils.cli import run_cli
from miles.utils.logging_utils import configure_logging

TRAINING_NOT_BUILT = (
    "The launch is valid, but training is not built yet: the training stack (Ray, models, rollout engines, "
    "the loop) arrives with the issue 'A real training stack on CPU'."
)


def train(args) -> None:
    configure_logging(args)
    # Hand-over point: the issue "A real training stack on CPU" replaces this with the sync loop.
    raise SystemExit(TRAINING_NOT_BUILT)


if __name__ == "__main__":
    run_cli(lambda: train(parse_args()))
