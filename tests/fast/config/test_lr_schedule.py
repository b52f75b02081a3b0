"""The learning-rate schedule against hand-computed rates and against megatron-core's OptimizerParamScheduler."""

import math

import pytest

from miles.config.lr_schedule import (
    LrSchedule,
    check_lr_schedules,
    learning_rate,
    schedule_for_role,
)
from miles.utils.arguments import parse_args
from miles.utils.errors import MilesConfigError


def _schedule(style: str, warmup: float = 5, decay: int = 20, init: float = 0.0) -> LrSchedule:
    return LrSchedule(max_lr=1e-3, min_lr=1e-4, warmup_init=init, warmup_iters=warmup, decay_iters=decay,
                      decay_style=style)


# Hand-computed: warm-up k/5 * 1e-3; after it ratio = (k - 5) / 15; cosine coeff (cos(pi r) + 1) / 2,
# linear 1 - r; rate = 1e-4 + coeff * 9e-4; past 20: 1e-4.
@pytest.mark.parametrize(("style", "iteration", "expected"), [
    ("cosine", 0, 0.0), ("cosine", 2, 4e-4), ("cosine", 5, 1e-3),
    ("cosine", 10, 1e-4 + 0.75 * 9e-4),  # r = 1/3, cos(pi/3) = 1/2
    ("cosine", 20, 1e-4), ("cosine", 21, 1e-4),
    ("linear", 10, 1e-4 + (2 / 3) * 9e-4), ("linear", 20, 1e-4), ("linear", 35, 1e-4),
    ("constant", 3, 6e-4), ("constant", 6, 1e-3), ("constant", 1000, 1e-3),
    ("inverse-square-root", 20, 1e-3 * math.sqrt(5) / math.sqrt(20)),
])
def test_rates_match_hand_computed_values(style, iteration, expected):
    assert learning_rate(iteration, _schedule(style)) == pytest.approx(expected, rel=1e-12, abs=1e-18)


def test_warmup_starts_from_its_init_and_no_warmup_starts_at_the_peak():
    assert learning_rate(0, _schedule("cosine", init=2e-4)) == pytest.approx(2e-4)
    assert learning_rate(1, _schedule("cosine", init=2e-4)) == pytest.approx(2e-4 + 8e-4 / 5)
    assert learning_rate(0, _schedule("cosine", warmup=0)) == pytest.approx(1e-3)  # cos(0): the peak


def _args(*flags):
    return parse_args(argv=["--advantage-estimator", "ppo", "--keep-old-actor", "--num-rollout", "10",
                            "--num-steps-per-rollout", "2", *flags])


def test_roles_share_the_decay_and_each_has_its_peak_and_warmup():
    args = _args("--lr", "1e-3", "--critic-lr", "5e-3", "--lr-warmup-iters", "4", "--critic-lr-warmup-iters", "2",
                 "--lr-decay-style", "cosine", "--min-lr", "1e-5")
    actor, critic = schedule_for_role(args, "actor"), schedule_for_role(args, "critic")
    assert (actor.max_lr, actor.warmup_iters, actor.decay_iters) == (1e-3, 4, 20)  # 10 rollouts x 2 steps
    assert (critic.max_lr, critic.warmup_iters, critic.decay_iters) == (5e-3, 2, 20)
    assert actor.min_lr == critic.min_lr == 1e-5 and actor.decay_style == critic.decay_style == "cosine"


def test_warmup_fraction_is_of_the_decay_iterations():
    args = _args("--lr-warmup-fraction", "0.25", "--lr-decay-iters", "12")
    assert schedule_for_role(args, "actor").warmup_iters == schedule_for_role(args, "critic").warmup_iters == 3


@pytest.mark.parametrize(("flags", "words"), [
    (["--lr-warmup-iters", "20"], "must be shorter than the decay"),
    (["--lr-warmup-iters", "5", "--lr-decay-iters", "5"], "must be shorter than the decay"),
    (["--critic-lr-warmup-iters", "30"], "--critic-lr-warmup-iters"),
    (["--min-lr", "1"], "--min-lr 1.0 is above --lr"),
    (["--lr-warmup-init", "1"], "--lr-warmup-init 1.0 is above --lr"),
    (["--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "2"], "takes only one of them"),
])
def test_schedules_megatron_refuses_are_refused_at_startup(flags, words):
    with pytest.raises(MilesConfigError, match=words):
        _args(*flags)


def test_the_check_waits_for_num_rollout_under_num_epoch():
    args = parse_args(argv=["--num-epoch", "1", "--lr-warmup-iters", "1000"])  # accepted: the length is unknown
    args.num_rollout = 10
    with pytest.raises(MilesConfigError, match="must be shorter than the decay"):
        check_lr_schedules(args)


@pytest.mark.megatron
@pytest.mark.parametrize("style", ["constant", "linear", "cosine", "inverse-square-root"])
def test_rates_equal_megatron_cores_scheduler_stepped_in_samples(style):
    """The independent reference: megatron-core's scheduler, stepped as upstream steps it (global batch size
    samples per optimizer step, warm-up and decay in samples)."""
    import megatron.core.optimizer_param_scheduler as scheduler_module  # the marker skips it only without the extra
    global_batch, warmup, decay = 16, 3, 12

    class _Optimizer:
        param_groups = [{"lr": 0.0, "weight_decay": 0.0}]

    reference = scheduler_module.OptimizerParamScheduler(
        _Optimizer(), init_lr=1e-5, max_lr=1e-3, min_lr=1e-4, lr_warmup_steps=warmup * global_batch,
        lr_decay_steps=decay * global_batch, lr_decay_style=style, start_wd=0.0, end_wd=0.0,
        wd_incr_steps=decay * global_batch, wd_incr_style="constant")
    ours = LrSchedule(max_lr=1e-3, min_lr=1e-4, warmup_init=1e-5, warmup_iters=warmup, decay_iters=decay,
                      decay_style=style)
    for iteration in range(decay + 3):
        # the rate optimizer step `iteration` runs at: set by the scheduler's previous step
        assert learning_rate(iteration, ours) == pytest.approx(_Optimizer.param_groups[0]["lr"], rel=1e-12)
        reference.step(increment=global_batch)
