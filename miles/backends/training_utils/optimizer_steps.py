"""Optimizer steps over a rollout's samples, and the no-grad passes over them (the step's own configuration).

``run_optimizer_steps`` accumulates micro-batch gradients whose losses are already divided by the whole step's
divisor, so the gradient does not depend on micro-batching (docs/design.md §7); ``StepConfig`` holds the flags that
shape the steps, built once from ``args``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from miles.backends.training_utils.loss import step_divisor
from miles.backends.training_utils.micro_batches import (
    balanced_order,
    fixed_micro_batches,
    token_budget_micro_batches,
)
from miles.backends.training_utils.optimizer import set_learning_rate
from miles.guard.divergence import check_finite_step
from miles.ranks.data_parallel import SingleRank
from miles.utils.types import Sample

Tensors = list[torch.Tensor]
SINGLE_RANK = SingleRank()


@dataclass(frozen=True)
class StepConfig:
    """The flags that shape a train process's optimizer steps and no-grad passes."""

    global_batch_size: int
    micro_batch_size: int
    per_token: bool  # --calculate-per-token-loss
    clip_grad: float
    max_tokens_per_micro_batch: int | None  # --max-tokens-per-gpu under --use-dynamic-batch-size, else None
    max_tokens_per_no_grad_pass: int | None  # --log-probs-max-tokens-per-gpu, likewise
    balance_data: bool
    log_probs_chunk_size: int | None = None  # tokens per log-softmax (--log-probs-chunk-size > 0), else whole
    deterministic: bool = False  # --deterministic-mode: deterministic torch algorithms only, in this process

    @classmethod
    def from_args(cls, args) -> StepConfig:
        dynamic = args.use_dynamic_batch_size
        return cls(args.global_batch_size, args.micro_batch_size, args.calculate_per_token_loss, args.clip_grad,
                   args.max_tokens_per_gpu if dynamic else None, args.log_probs_max_tokens_per_gpu if dynamic else None,
                   args.balance_data, args.log_probs_chunk_size if args.log_probs_chunk_size > 0 else None,
                   args.deterministic_mode)


def run_optimizer_steps(
    clip_grad_norm: Callable[[float], float],
    optimizer: torch.optim.Optimizer,
    loss_masks: Tensors,
    global_batch_size: int,
    micro_batch_size: int,
    per_token: bool,
    clip_grad: float,
    micro_batch_loss: Callable[[list[int], float], tuple[torch.Tensor, dict[str, float]]],
    where: str = "training",
    data_parallel: SingleRank = SINGLE_RANK,
    learning_rate: Callable[[int], float] | None = None,
    lengths: list[int] | None = None,
    max_tokens_per_micro_batch: int | None = None,
    balance_data: bool = False,
) -> dict[str, float]:
    """Optimizer steps over consecutive global batches of sample indices, accumulating micro-batch gradients.

    ``micro_batch_loss(indices, divisor)`` returns a loss already divided by the step's divisor;
    ``clip_grad_norm(max_norm)`` clips the accumulated gradients and returns their norm. Metrics are averaged over
    samples (each micro-batch's metrics weighted by its size); ``grad_norm`` over steps. ``data_parallel`` gives
    this rank its slice of each step and sums gradients and metric totals over the ranks
    (``miles.ranks.data_parallel``), so every rank takes the single-process step and reports its metrics. A
    non-finite loss or gradient norm raises ``DivergenceError`` (naming ``where``) before its step is applied.
    ``learning_rate(s)``, when given, is the rate of this call's step ``s`` (from 0); metric ``lr`` is the rate of
    the last step.

    ``lengths`` (tokens per sample) drive two regroupings of a step's samples that leave its gradient as it is
    (``micro_batches``): ``max_tokens_per_micro_batch`` cuts this rank's share by padded token budget instead of
    ``micro_batch_size``; ``balance_data`` gives the DP ranks shares of similar token totals.
    """
    num_samples = len(loss_masks)
    totals: dict[str, float] = {}
    grad_norms = []
    for step_start in range(0, num_samples, global_batch_size):
        step = list(range(step_start, min(step_start + global_batch_size, num_samples)))
        if learning_rate is not None:
            set_learning_rate(optimizer, learning_rate(len(grad_norms)))
        divisor = step_divisor([loss_masks[i] for i in step], per_token)
        optimizer.zero_grad(set_to_none=True)
        step_loss = 0.0
        if balance_data:
            step = balanced_order(step, lengths, data_parallel.size)
        local = data_parallel.local_indices(step)
        if max_tokens_per_micro_batch is None:
            micro_batches = fixed_micro_batches(local, micro_batch_size)
        else:
            micro_batches = token_budget_micro_batches(local, lengths, max_tokens_per_micro_batch)
        for micro in micro_batches:
            loss, metrics = micro_batch_loss(micro, divisor)
            loss.backward()
            step_loss += float(loss.detach())
            for name, value in metrics.items():
                totals[name] = totals.get(name, 0.0) + value * len(micro)
        data_parallel.reduce_gradients(p for group in optimizer.param_groups for p in group["params"])
        grad_norms.append(clip_grad_norm(clip_grad))
        check_finite_step(where, len(grad_norms) - 1, step_loss, grad_norms[-1])
        optimizer.step()
    totals = data_parallel.sum_totals(totals)
    averaged = {name: total / num_samples for name, total in totals.items()}
    averaged["grad_norm"] = sum(grad_norms) / len(grad_norms)
    averaged["lr"] = optimizer.param_groups[0]["lr"]
    return averaged


def no_grad_passes(max_tokens: int | None, samples: list[Sample], forward: Callable[[list[Sample]], Tensors]) -> Tensors:
    """``forward`` over all samples at once, or (``max_tokens``, --use-dynamic-batch-size) over micro-batches within
    that token budget: each row is masked from the others, so per-sample outputs agree to float rounding."""
    if max_tokens is None:
        return forward(samples)
    lengths = [len(sample.tokens) for sample in samples]
    outputs: list[torch.Tensor | None] = [None] * len(samples)
    for micro in token_budget_micro_batches(range(len(samples)), lengths, max_tokens):
        for i, output in zip(micro, forward([samples[i] for i in micro]), strict=True):
            outputs[i] = output
    return outputs
