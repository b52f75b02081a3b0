"""The learning-rate schedule: Megatron's ``OptimizerParamScheduler.get_lr`` as a pure function of the step.

An *iteration* is one optimizer step, counted over the whole run (across rollouts, and across a resume: the count
is saved in the checkpoint). Rollout r's s-th step (from 0) is iteration ``r * num_steps_per_rollout + s`` when
the role trained every rollout; the actor does not step during ``--num-critic-only-steps``, so its count lags by
those rollouts. The run has ``train_iters = num_rollout * num_steps_per_rollout`` iterations, upstream's
``num_rollout * rollout_batch_size * n_samples_per_prompt // global_batch_size``.

Megatron counts its scheduler in samples (``increment=global_batch_size`` per step, every length times the
global batch size); every ratio below is the same in iterations, so the rates are identical. As in Megatron, the
rate of iteration k is ``learning_rate(k)``: the scheduler starts at step 0 and steps after each optimizer step,
so with a warm-up the first step runs at ``--lr-warmup-init`` (0 by default).

Imports nothing heavy and lives in configuration: ``miles.config.arguments`` checks the schedule at startup,
and the train processes (``miles.backends.training_utils``) compute each step's rate from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from miles.config.errors import MilesConfigError

DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root")


@dataclass(frozen=True)
class LrSchedule:
    """One role's schedule, in iterations (optimizer steps). ``warmup_iters`` may be fractional
    (``--lr-warmup-fraction`` x ``decay_iters``), as Megatron's warm-up steps may."""

    max_lr: float
    min_lr: float
    warmup_init: float
    warmup_iters: float
    decay_iters: int
    decay_style: str


def learning_rate(iteration: int, schedule: LrSchedule) -> float:
    """The rate of optimizer step ``iteration`` (Megatron's get_lr, https://openreview.net/pdf?id=BJYwwY9ll p. 4).

    warm-up (k <= W, W > 0):  init + (max - init) * k / W
    constant:                 max
    k > D:                    min
    inverse-square-root:      max(min, max * sqrt(max(W, 1)) / sqrt(max(k, 1)))
    otherwise, with ratio = (k - W) / (D - W) and coeff = 1 - ratio (linear) or (cos(pi * ratio) + 1) / 2 (cosine):
                              min + coeff * (max - min)
    """
    s, k = schedule, iteration
    if s.warmup_iters > 0 and k <= s.warmup_iters:
        return s.warmup_init + (s.max_lr - s.warmup_init) * float(k) / float(s.warmup_iters)
    if s.decay_style == "constant":
        return s.max_lr
    if k > s.decay_iters:
        return s.min_lr
    if s.decay_style == "inverse-square-root":
        return max(s.min_lr, s.max_lr * max(s.warmup_iters, 1) ** 0.5 / max(k, 1) ** 0.5)
    decay_ratio = float(k - s.warmup_iters) / float(s.decay_iters - s.warmup_iters)
    if s.decay_style == "linear":
        coeff = 1.0 - decay_ratio
    elif s.decay_style == "cosine":
        coeff = 0.5 * (math.cos(math.pi * decay_ratio) + 1.0)
    else:
        raise ValueError(f"unknown --lr-decay-style {s.decay_style!r}; valid: {', '.join(DECAY_STYLES)}")
    return s.min_lr + coeff * (s.max_lr - s.min_lr)


def train_iters(args) -> int:
    """Optimizer steps of the whole run (upstream's ``args.train_iters``)."""
    return args.num_rollout * args.num_steps_per_rollout


def schedule_for_role(args, role: str) -> LrSchedule:
    """Upstream's schedule of ``role``: the critic's peak is ``--critic-lr`` and its warm-up
    ``--critic-lr-warmup-iters`` (upstream's critic sets ``args.lr`` and ``args.lr_warmup_iters`` from them); the
    decay style, ``--min-lr``, ``--lr-decay-iters`` and ``--lr-warmup-fraction`` are shared. Refuses a schedule
    Megatron refuses (``MilesConfigError``)."""
    critic = role == "critic"
    decay_iters = args.lr_decay_iters if args.lr_decay_iters is not None else train_iters(args)
    if args.lr_warmup_fraction is not None:
        warmup_iters = args.lr_warmup_fraction * decay_iters
    else:
        warmup_iters = args.critic_lr_warmup_iters if critic else args.lr_warmup_iters
    schedule = LrSchedule(max_lr=args.critic_lr if critic else args.lr, min_lr=args.min_lr,
                          warmup_init=args.lr_warmup_init, warmup_iters=warmup_iters, decay_iters=decay_iters,
                          decay_style=args.lr_decay_style)
    _check(schedule, "--critic-lr" if critic else "--lr", "--critic-lr-warmup-iters" if critic else "--lr-warmup-iters")
    return schedule


def _check(s: LrSchedule, lr_flag: str, warmup_flag: str) -> None:
    """Megatron's assertions on a schedule, as errors that name the flags."""
    if s.min_lr > s.max_lr:
        raise MilesConfigError(f"--min-lr {s.min_lr} is above {lr_flag} {s.max_lr}, but the schedule decays from "
                               f"{lr_flag} down to --min-lr. Pass --min-lr <= {s.max_lr}.")
    if s.warmup_init > s.max_lr:
        raise MilesConfigError(f"--lr-warmup-init {s.warmup_init} is above {lr_flag} {s.max_lr}, but the warm-up "
                               f"rises from --lr-warmup-init to {lr_flag}. Pass --lr-warmup-init <= {s.max_lr}.")
    if s.warmup_iters >= s.decay_iters:
        raise MilesConfigError(
            f"the warm-up ({s.warmup_iters:g} optimizer steps: {warmup_flag} or --lr-warmup-fraction) must be shorter "
            f"than the decay ({s.decay_iters} steps: --lr-decay-iters, by default --num-rollout x "
            "--num-steps-per-rollout), as Megatron requires. Shorten the warm-up or lengthen --lr-decay-iters.")


def check_lr_schedules(args) -> None:
    """Both roles' schedules are valid (startup check, once ``--num-rollout`` is known)."""
    if args.lr_warmup_fraction is not None and (args.lr_warmup_iters or args.critic_lr_warmup_iters):
        raise MilesConfigError(
            f"--lr-warmup-fraction {args.lr_warmup_fraction} and a warm-up in iterations (--lr-warmup-iters "
            f"{args.lr_warmup_iters}, --critic-lr-warmup-iters {args.critic_lr_warmup_iters}) are both set; Megatron "
            "takes only one of them. Drop one.")
    schedule_for_role(args, "actor")
    if args.use_critic:
        schedule_for_role(args, "critic")
