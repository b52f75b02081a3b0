"""What --balance-data changes in the DP ranks' token load, on a stated length distribution (no model, no Ray).

Each optimizer step's samples are shared over the DP ranks as the step loop shares them (``run_optimizer_steps``):
contiguous equal counts without --balance-data, ``balanced_order``'s shares with it; each rank then cuts its
share into fixed micro-batches of --micro-batch-size, each padded to its longest sample (``padded_tokens``).
The step waits for its slowest rank, so per step it measures the most-loaded rank:

- load imbalance: max over ranks of a rank's real tokens / the mean over ranks (1.0 is perfect balance);
- padding: the padded / real token ratio of the rank with the most padded tokens (1.0 is no padding).

Lengths are prompt + response tokens, drawn with a fixed seed from a stated distribution standing in for RL
rollouts: a prompt of 64-256 tokens (uniform) and a log-normal response (median 300, sigma 0.8, cut at 4,096),
the long right tail of sampled reasoning. Printed: the mean over steps of each number, with and without.

    python bench/balance_data.py [--steps 200] [--global-batch-size 64] [--ranks 4] [--micro-batch-size 4]
"""

import argparse
import random
import statistics

from miles.backends.training_utils.micro_batches import balanced_order, fixed_micro_batches, padded_tokens


def draw_lengths(count: int, seed: int) -> list[int]:
    """Prompt (uniform 64..256) + response (log-normal, median 300, sigma 0.8, at most 4,096) token counts."""
    rng = random.Random(seed)
    return [rng.randint(64, 256) + min(4096, max(1, round(rng.lognormvariate(5.7038, 0.8)))) for _ in range(count)]


def step_load(lengths: list[int], ranks: int, micro_batch_size: int, balance: bool) -> tuple[float, float]:
    """(max / mean rank real tokens, padded / real tokens of the rank with most padded tokens) for one step."""
    indices = list(range(len(lengths)))
    order = balanced_order(indices, lengths, ranks) if balance else indices
    share = len(order) // ranks
    shares = [order[r * share:(r + 1) * share] for r in range(ranks)]
    real = [sum(lengths[i] for i in part) for part in shares]
    padded = [sum(padded_tokens(m, lengths) for m in fixed_micro_batches(part, micro_batch_size)) for part in shares]
    worst = max(range(ranks), key=lambda r: padded[r])
    return max(real) / statistics.mean(real), padded[worst] / real[worst]


def measure(steps: int, global_batch_size: int, ranks: int, micro_batch_size: int, seed: int = 0) -> dict:
    """Mean over ``steps`` steps of ``step_load``'s two numbers, without and with balancing."""
    lengths = draw_lengths(steps * global_batch_size, seed)
    batches = [lengths[s * global_batch_size:(s + 1) * global_batch_size] for s in range(steps)]
    result = {}
    for balance in (False, True):
        loads = [step_load(batch, ranks, micro_batch_size, balance) for batch in batches]
        result[balance] = tuple(statistics.mean(column) for column in zip(*loads))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--global-batch-size", type=int, default=64)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    args = parser.parse_args()
    result = measure(args.steps, args.global_batch_size, args.ranks, args.micro_batch_size)
    print(f"{args.steps} steps of {args.global_batch_size} samples over {args.ranks} DP ranks, "
          f"micro-batch size {args.micro_batch_size} (means over steps)")
    print(f"{'':16}{'max/mean rank real tokens':>28}{'worst-rank padded/real tokens':>32}")
    for balance, (imbalance, padding) in result.items():
        print(f"{'--balance-data' if balance else 'contiguous':16}{imbalance:>28.3f}{padding:>32.3f}")


if __name__ == "__main__":
    main()
