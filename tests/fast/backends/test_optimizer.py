"""The optimizer as Megatron builds it: decoupled weight decay (one step, hand-computed), no decay on biases and
1-D parameters, and the step loop's rate per optimizer step, counted across rollouts."""

import pytest
import torch

from miles.backends.training_utils.optimizer import OptimizerConfig, build_optimizer, parameter_groups
from miles.backends.training_utils.train_model import TrainModel
from miles.backends.train_process import _TrainProcess
from miles.config.lr_schedule import learning_rate
from miles.utils.arguments import parse_args


class _Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([[1.0, -2.0], [3.0, 0.5]]))  # 2-D: decayed
        self.bias = torch.nn.Parameter(torch.tensor([2.0, -1.0]))  # a bias: not decayed
        self.norm = torch.nn.Parameter(torch.tensor([4.0]))  # 1-D: not decayed


# Loss sum(G * weight) + sum(g_b * bias) + sum(g_n * norm): the gradients are these constants.
G_WEIGHT = torch.tensor([[0.5, -0.25], [2.0, 1.0]])
G_BIAS = torch.tensor([-4.0, 0.125])
G_NORM = torch.tensor([3.0])


def _one_step(config: OptimizerConfig, lr: float) -> _Toy:
    model = _Toy()
    optimizer = build_optimizer(model.named_parameters(), config, lr)
    ((G_WEIGHT * model.weight).sum() + (G_BIAS * model.bias).sum() + (G_NORM * model.norm).sum()).backward()
    optimizer.step()
    return model


def test_one_adam_step_decays_the_weight_decoupled_and_spares_biases_and_1d_parameters():
    """Adam's first step: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps), whatever the betas;
    decoupled decay multiplies the weight by (1 - lr * wd) (AdamW, Megatron's Adam). lr 0.1, wd 0.1:
    weight 1.0, g 0.5  -> 1.0 * 0.99 - 0.1 = 0.89;   -2.0, g -0.25 -> -1.98 + 0.1 = -1.88;
    3.0, g 2.0  -> 2.97 - 0.1 = 2.87;                 0.5, g 1.0 -> 0.495 - 0.1 = 0.395;
    bias 2.0, g -4 -> 2.1; -1.0, g 0.125 -> -1.1;     norm 4.0, g 3 -> 3.9 (no decay on either)."""
    model = _one_step(OptimizerConfig("adam", weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.98, adam_eps=1e-8), 0.1)
    # |g| >= 0.125, so eps moves the update by at most 0.1 * 1e-8 / 0.125 = 8e-9; float32 rounding ~1e-7.
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[0.89, -1.88], [2.87, 0.395]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(model.bias.detach(), torch.tensor([2.1, -1.1]), atol=1e-6, rtol=0)
    torch.testing.assert_close(model.norm.detach(), torch.tensor([3.9]), atol=1e-6, rtol=0)


def test_one_sgd_step_adds_l2_decay_to_the_gradient():
    """SGD's first step with momentum: the buffer is g + wd * p, so p <- p - lr * (g + wd * p); lr 0.1, wd 0.1:
    weight 1.0 -> 1.0 - 0.1 * (0.5 + 0.1) = 0.94; bias 2.0 -> 2.0 - 0.1 * (-4.0) = 2.4 (no decay)."""
    model = _one_step(OptimizerConfig("sgd", weight_decay=0.1, sgd_momentum=0.9), 0.1)
    expected = torch.tensor([[1.0, -2.0], [3.0, 0.5]]) - 0.1 * (G_WEIGHT + 0.1 * torch.tensor([[1.0, -2.0], [3.0, 0.5]]))
    torch.testing.assert_close(model.weight.detach(), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(model.bias.detach(), torch.tensor([2.4, -1.0125]), atol=1e-6, rtol=0)


def test_megatrons_rule_on_the_embedded_model(embedded):
    from miles.models.hf import load_causal_lm  # a real model's names: q_proj.bias, norm.weight

    model = load_causal_lm(embedded.checkpoint_dir)
    decay, no_decay = parameter_groups(model.named_parameters(), 0.01)
    names = {id(p): name for name, p in model.named_parameters()}
    assert all(p.dim() >= 2 for p in decay["params"]) and decay["weight_decay"] == 0.01
    assert no_decay["weight_decay"] == 0.0
    skipped = {names[id(p)] for p in no_decay["params"]}
    assert "model.norm.weight" in skipped and any(name.endswith("q_proj.bias") for name in skipped)
    assert not any(name.endswith(".bias") for name in (names[id(p)] for p in decay["params"]))


def test_the_rate_follows_the_schedule_across_rollouts_and_is_logged():
    """Two rollouts of 8 samples, global batch 4: iterations 0, 1 then 2, 3; metric lr is the last step's rate."""
    args = parse_args(argv=["--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--global-batch-size", "4",
                            "--micro-batch-size", "4", "--num-rollout", "3", "--lr", "1e-2", "--lr-warmup-iters",
                            "2", "--lr-decay-style", "cosine", "--min-lr", "1e-3"])
    process = _TrainProcess(args, TrainModel(torch.nn.Linear(2, 1)))
    seen = []
    original_step = process.optimizer.step
    process.optimizer.step = lambda: (seen.append(process.optimizer.param_groups[0]["lr"]), original_step())[1]
    x = torch.ones(2)

    def micro_batch_loss(indices, divisor):
        return process.model.module(x).sum() * len(indices) / divisor, {}

    logged = [process._optimizer_steps(rollout, [torch.ones(1)] * 8, micro_batch_loss)["lr"] for rollout in (0, 1)]
    # Hand-computed: warm-up 0, 5e-3, 1e-2 at k = 0, 1, 2; then cosine over D - W = 6 - 2 = 4 steps:
    # k = 3: ratio 1/4, coeff (cos(pi/4) + 1) / 2 = 0.853553..., rate 1e-3 + 0.853553 * 9e-3.
    expected = [0.0, 5e-3, 1e-2, 1e-3 + (2 ** -0.5 + 1) / 2 * 9e-3]
    assert seen == pytest.approx(expected, rel=1e-12, abs=1e-18)
    assert logged == pytest.approx([expected[1], expected[3]], rel=1e-12)
    assert process.optimizer_steps == 4
    assert seen == [learning_rate(k, process.schedule) for k in range(4)]
