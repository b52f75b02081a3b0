"""How one optimizer step's samples are cut into forward passes and shared over data-parallel ranks.

Pure functions of sample indices and token lengths (prompt + response), no ``args``. Both backends right-pad a
micro-batch to its longest sample (``responses.pad_right``), so a micro-batch's cost is its padded size:

    padded_tokens(mb) = len(mb) * max_{i in mb} L_i

- ``fixed_micro_batches``: consecutive runs of ``--micro-batch-size`` samples (the default).
- ``token_budget_micro_batches`` (``--use-dynamic-batch-size --max-tokens-per-gpu B``): first-fit decreasing on the
  padded size, so every micro-batch has padded_tokens <= B; a sample longer than B alone is its own micro-batch
  (upstream gives it one too: its first fit opens a new micro-batch for a sample that fits none).
- ``balanced_order`` (``--balance-data``): the step's samples reordered so that the DP ranks' contiguous equal shares
  (``DataParallelRank.local_indices``) hold similar token totals: greedy longest-first into the lightest rank
  that still has room (upstream uses Karmarkar-Karp with equal sizes; both are heuristics for the same partition).

None of them changes which samples a step holds, only how they are grouped: the step's loss is divided by the
whole step's divisor before the micro-batch split (``run_optimizer_steps``), so the gradient is the same sum.
"""

from __future__ import annotations

from collections.abc import Sequence


def padded_tokens(micro_batch: Sequence[int], lengths: Sequence[int]) -> int:
    """len(mb) * max L_i: the tokens of the right-padded (B, T) batch one forward pass builds."""
    return len(micro_batch) * max((lengths[i] for i in micro_batch), default=0)


def fixed_micro_batches(indices: Sequence[int], micro_batch_size: int) -> list[list[int]]:
    """Consecutive runs of ``micro_batch_size`` indices (the last one may be shorter)."""
    return [list(indices[start : start + micro_batch_size]) for start in range(0, len(indices), micro_batch_size)]


def token_budget_micro_batches(indices: Sequence[int], lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """First-fit decreasing: longest first, each into the first micro-batch whose padded size stays <= max_tokens.

    Longest first, a micro-batch's first sample is its longest, so adding a sample makes its padded size
    (count + 1) * first length. Each micro-batch lists its indices in ascending order (the order the loss sees).
    """
    order = sorted(indices, key=lambda i: (-lengths[i], i))
    micro_batches: list[list[int]] = []
    for i in order:
        for micro_batch in micro_batches:
            if (len(micro_batch) + 1) * lengths[micro_batch[0]] <= max_tokens:
                micro_batch.append(i)
                break
        else:
            micro_batches.append([i])  # alone even when L_i > max_tokens: a sample is never split
    return [sorted(micro_batch) for micro_batch in micro_batches]


def balanced_partition(indices: Sequence[int], lengths: Sequence[int], num_parts: int) -> list[list[int]]:
    """``num_parts`` parts of len(indices) / num_parts indices each, with similar sums of L_i.

    Longest first (ties by index), each sample goes to the part with the smallest token sum among those not yet
    full (ties: the lowest part). Each part lists its indices in ascending order.
    """
    if len(indices) % num_parts:
        raise ValueError(f"{len(indices)} samples cannot be split into {num_parts} equal parts")
    share = len(indices) // num_parts
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    sums = [0] * num_parts
    for i in sorted(indices, key=lambda i: (-lengths[i], i)):
        part = min((p for p in range(num_parts) if len(parts[p]) < share), key=lambda p: (sums[p], p))
        parts[part].append(i)
        sums[part] += lengths[i]
    return [sorted(part) for part in parts]


def balanced_order(indices: Sequence[int], lengths: Sequence[int], num_parts: int) -> list[int]:
    """The indices reordered as the concatenation of ``balanced_partition``'s parts: rank r's contiguous equal
    share is then part r."""
    return [i for part in balanced_partition(indices, lengths, num_parts) for i in part]
