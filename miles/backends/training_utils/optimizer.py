"""The optimizer of a train role, as Megatron builds it from ``--optimizer`` and its flags, for both backends.

- ``adam``: Adam with decoupled weight decay (Megatron's Adam is apex/TE FusedAdam in AdamW mode, or
  ``torch.optim.AdamW``): per step ``p <- p * (1 - lr * wd) - lr * m_hat / (sqrt(v_hat) + eps)``.
- ``sgd``: ``torch.optim.SGD`` with ``--sgd-momentum`` and L2 weight decay added to the gradient, as Megatron's.

As in Megatron (``megatron.core.optimizer``), biases and one-dimensional parameters (norm weights) get no weight
decay: two parameter groups, "decay" then "no_decay". The learning rate of each step is set by the step loop from
``miles.config.lr_schedule.learning_rate``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "adam"
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    sgd_momentum: float = 0.9

    @classmethod
    def from_args(cls, args) -> OptimizerConfig:
        return cls(args.optimizer, args.weight_decay, args.adam_beta1, args.adam_beta2, args.adam_eps,
                   args.sgd_momentum)


def takes_weight_decay(name: str, parameter: torch.Tensor) -> bool:
    """Megatron's default rule: no weight decay on biases and on 1-D parameters."""
    return not (name.endswith(".bias") or parameter.dim() == 1)


def parameter_groups(named_parameters: Iterable[tuple[str, torch.nn.Parameter]], weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, parameter in named_parameters:
        if parameter.requires_grad:
            (decay if takes_weight_decay(name, parameter) else no_decay).append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay, "name": "decay"},
              {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]
    return [group for group in groups if group["params"]]


def build_optimizer(named_parameters: Iterable[tuple[str, torch.nn.Parameter]], config: OptimizerConfig,
                    lr: float) -> torch.optim.Optimizer:
    groups = parameter_groups(named_parameters, config.weight_decay)
    if config.name == "adam":
        return torch.optim.AdamW(groups, lr=lr, betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_eps)
    if config.name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=config.sgd_momentum)
    raise ValueError(f"unknown --optimizer {config.name!r}; valid: {', '.join(OPTIMIZERS)}")


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
