"""The range of every numeric flag, and the path flags that may not be empty, as one table checked at startup.

``check_flag_values(args)`` runs first in ``miles_validate_args``: a value outside its range (``nan`` and ``inf``
included, unless the table says ``inf`` means something) is a ``MilesConfigError`` naming the value, the rule and
a value that works, before any derived value is filled from it. A numeric flag without an entry here is a bug
(tests/fast/utils/test_flag_rules.py checks every ``type=float``/``type=int`` flag of the parser has one).

Imports nothing heavy: it runs before torch or Ray are imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from miles.config.errors import MilesConfigError

SEED_MAX = 2**31 - 1  # random, numpy and torch all accept [0, 2**31 - 1]; the critic seeds with --seed + 1


@dataclass(frozen=True)
class Range:
    """``low <= value <= high`` (``<`` where the side is open), finite unless ``allow_inf``; ``None`` (unset) is
    always allowed. ``example`` is a value that works; ``why`` says what the range protects, when that is not
    obvious."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    allow_inf: bool = False
    example: str = "1"
    why: str = ""

    def holds(self, value: float) -> bool:
        if isinstance(value, float) and (math.isnan(value) or (math.isinf(value) and not self.allow_inf)):
            return False  # (an int is finite, and may be too large for math.isnan)
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self, value: float) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {_number(self.low)}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {_number(self.high)}")
        if isinstance(value, float):
            parts.append("may be inf" if self.allow_inf else "finite")
        return " and ".join(parts)


def _number(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


AT_LEAST_ONE = Range(low=1, example="1")
NON_NEGATIVE = Range(low=0, example="0")
SEED = Range(low=0, high=SEED_MAX, example="1234", why="random, numpy and torch accept seeds in this range")

# dest -> rule. Ints and floats alike: argparse already refused what is not a number of the flag's type.
FLAG_RULES: dict[str, Range] = {
    # algorithm
    "eps_clip": Range(low=0, high=1, low_open=True, high_open=True, example="0.2",
                      why="the ratio is clipped to [1 - eps, 1 + eps-high], whose low side must stay positive"),
    "eps_clip_high": Range(low=0, low_open=True, example="0.28"),
    "eps_clip_c": Range(low=1, low_open=True, example="3",
                        why="the dual-clip constant caps -A * ratio at -c * A for negative advantages"),
    "value_clip": Range(low=0, low_open=True, example="0.2"),
    "kl_coef": Range(low=0, example="0", why="a negative coefficient rewards moving away from the reference"),
    "kl_loss_coef": Range(low=0, example="0.01", why="a negative coefficient rewards moving away from the reference"),
    "entropy_coef": Range(low=0, example="0", why="a negative bonus drives the policy to collapse onto one answer"),
    "gamma": Range(low=0, high=1, example="1.0"),
    "lambd": Range(low=0, high=1, example="1.0"),
    "num_critic_only_steps": NON_NEGATIVE,
    # off-policy correction and runtime guard
    "tis_clip": Range(low=0, low_open=True, allow_inf=True, example="2", why="inf means no cap"),
    "tis_clip_low": NON_NEGATIVE,
    "rs_lower_bound": NON_NEGATIVE,
    "rs_upper_bound": Range(low=0, low_open=True, allow_inf=True, example="1.01", why="inf means no upper bound"),
    "rs_veto_threshold": Range(low=0, high=1, low_open=True, high_open=True, example="1e-4",
                               why="a token ratio below it vetoes its sequence; ratios near 1 are the normal case"),
    "opsm_delta": Range(low=0, example="1e-4", why="a mean log-ratio threshold; below 0 masks on-policy sequences"),
    "keep_old_actor_tol": Range(low=0, low_open=True, example="1e-4",
                                why="the guard's tolerance; 1e-4 suits the torch engine in fp32"),
    "max_weight_staleness": Range(low=0, example="1"),
    "max_behavior_kl": Range(low=0, low_open=True, example="0.1"),
    # training loop
    "num_rollout": AT_LEAST_ONE,
    "num_epoch": AT_LEAST_ONE,
    "rollout_batch_size": AT_LEAST_ONE,
    "over_sampling_batch_size": AT_LEAST_ONE,
    "n_samples_per_prompt": AT_LEAST_ONE,
    "global_batch_size": AT_LEAST_ONE,
    "num_steps_per_rollout": AT_LEAST_ONE,
    "micro_batch_size": AT_LEAST_ONE,
    "max_tokens_per_gpu": AT_LEAST_ONE,
    "log_probs_max_tokens_per_gpu": AT_LEAST_ONE,
    "log_probs_chunk_size": Range(low=-1, example="-1", why="-1 or 0 means the whole response at once"),
    "update_weights_interval": AT_LEAST_ONE,
    "start_rollout_id": Range(low=0, example="0", why="rollout ids count from 0"),
    "debug_exit_after_rollout": Range(low=0, example="0", why="rollout ids count from 0"),
    "seed": SEED,
    "lr": Range(low=0, example="3e-4", why="0 freezes the actor; Adam refuses a negative rate"),
    "critic_lr": Range(low=0, example="3e-4", why="0 freezes the critic; Adam refuses a negative rate"),
    "clip_grad": Range(low=0, low_open=True, allow_inf=True, example="1.0",
                       why="the gradient norm is scaled down to it; inf means no clipping"),
    # optimizer and learning-rate schedule
    "weight_decay": Range(low=0, example="0.01", why="a negative decay grows the weights"),
    "adam_beta1": Range(low=0, high=1, high_open=True, example="0.9", why="Adam's moment averages need 0 <= beta < 1"),
    "adam_beta2": Range(low=0, high=1, high_open=True, example="0.999",
                        why="Adam's moment averages need 0 <= beta < 1"),
    "adam_eps": Range(low=0, low_open=True, example="1e-8", why="it keeps Adam's denominator away from 0"),
    "sgd_momentum": Range(low=0, high=1, high_open=True, example="0.9"),
    "lr_decay_iters": AT_LEAST_ONE,
    "lr_warmup_iters": NON_NEGATIVE,
    "lr_warmup_fraction": Range(low=0, high=1, high_open=True, example="0.1",
                                why="the warm-up must end before the decay does"),
    "lr_warmup_init": Range(low=0, example="0"),
    "min_lr": Range(low=0, example="0"),
    "critic_lr_warmup_iters": NON_NEGATIVE,
    # train ranks (docs/ranks.md)
    "actor_num_nodes": AT_LEAST_ONE,
    "actor_num_gpus_per_node": AT_LEAST_ONE,
    "critic_num_nodes": AT_LEAST_ONE,
    "critic_num_gpus_per_node": AT_LEAST_ONE,
    "tensor_model_parallel_size": AT_LEAST_ONE,
    "pipeline_model_parallel_size": Range(low=1, high=1, example="1", why="pipeline parallelism is not implemented"),
    "attention_dropout": Range(low=0, high=1, high_open=True, example="0.0", why="a probability of dropping"),
    "hidden_dropout": Range(low=0, high=1, high_open=True, example="0.0", why="a probability of dropping"),
    "recompute_num_layers": AT_LEAST_ONE,
    # model architecture (checked against the checkpoint: miles/config/architecture.py)
    **dict.fromkeys(("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "kv_channels",
                     "vocab_size", "num_query_groups"), AT_LEAST_ONE),
    "layernorm_epsilon": Range(low=0, low_open=True, example="1e-6", why="it keeps the norm's denominator away from 0"),
    "rotary_base": Range(low=0, low_open=True, example="10000", why="the rotary frequencies are powers of it"),
    "rotary_percent": Range(low=0, high=1, low_open=True, example="1.0", why="the fraction of each head rotated"),
    # rollout and data
    "rollout_temperature": Range(low=0, low_open=True, example="1.0",
                                 why="log-probs are taken under logits / temperature"),
    "rollout_max_response_len": AT_LEAST_ONE,
    "rollout_seed": SEED,
    "rollout_num_engines": AT_LEAST_ONE,
    "rollout_num_gpus": AT_LEAST_ONE,
    "rollout_num_gpus_per_engine": Range(low=1, high=1, example="1",
                                         why="each engine is one process: tensor-parallel engines are not implemented"),
    "num_gpus_per_node": AT_LEAST_ONE,
    "rollout_engine_start_timeout": Range(low=0, low_open=True, example="600",
                                          why="seconds an SGLang engine may take to start (about 30 here)"),
    "sglang_router_port": Range(low=1, high=65535, example="30000", why="a TCP port"),
    "sglang_router_request_timeout_secs": AT_LEAST_ONE,
    "rollout_request_timeout": Range(low=0, low_open=True, example="600",
                                     why="seconds a generate function's HTTP request may wait for its answer"),
    "n_samples_per_eval_prompt": AT_LEAST_ONE,
    "eval_temperature": Range(low=0, low_open=True, example="1.0"),
    "eval_max_response_len": AT_LEAST_ONE,
    "rollout_top_p": Range(low=0, high=1, low_open=True, example="1.0", why="1.0 keeps every token"),
    "rollout_top_k": Range(low=-1, example="-1", why="-1 or 0 means no top-k"),
    "rollout_min_p": Range(low=0, high=1, example="0.0", why="0 means no min-p"),
    "rollout_stop_token_ids": Range(low=0, example="2", why="token ids count from 0"),
    "eval_top_p": Range(low=0, high=1, low_open=True, example="1.0", why="1.0 keeps every token"),
    "eval_top_k": Range(low=-1, example="-1", why="-1 or 0 means no top-k"),
    # checkpoints and logging
    "save_interval": AT_LEAST_ONE,
    "eval_interval": Range(low=0, example="25", why="0 disables evaluation"),
    "ray_placement_timeout": Range(low=0, low_open=True, example="60", why="seconds to wait for the CPU bundles"),
}

# Flags that name a file or folder: an empty string would mean the current folder (or nothing at all).
PATH_FLAGS = ("save_debug_rollout_data", "hf_checkpoint", "ref_load", "prompt_data", "eval_prompt_data", "eval_config",
              "load", "critic_load", "save", "critic_save", "log_dir", "wandb_dir")


NAMED_OTHERWISE = {"layernorm_epsilon": "--norm-epsilon"}  # upstream's dest is not its flag's name


def flag_name(dest: str) -> str:
    return NAMED_OTHERWISE.get(dest, "--" + dest.replace("_", "-"))


def _check_value(dest: str, rule: Range, value) -> None:
    if isinstance(value, (int, float)) and not rule.holds(value):
        flag = flag_name(dest)
        why = f" ({rule.why})" if rule.why else ""
        raise MilesConfigError(
            f"{flag} is {value!r}, but it must be {rule.describe(value)}{why}. Pass e.g. {flag} {rule.example}."
        )


def check_flag_values(args) -> None:
    """Refuse the first numeric flag outside its range and the first empty path flag (see the module docstring)."""
    # Only values of the types argparse produces are judged: miles-check passes a placeholder for a flag whose value
    # is an unresolved shell word, and one unknown value must not stop the checks of every other flag.
    for dest, rule in FLAG_RULES.items():
        values = getattr(args, dest, None)
        for value in values if isinstance(values, list) else [values]:  # nargs="+" flags: each value
            _check_value(dest, rule, value)
    for dest in PATH_FLAGS:
        value = getattr(args, dest, None)
        if isinstance(value, list):  # --eval-prompt-data NAME PATH ...: no word may be empty
            value = next((word for word in value if not word.strip()), None)
        if isinstance(value, str) and not value.strip():
            flag = flag_name(dest)
            raise MilesConfigError(
                f"{flag} is {value!r}, an empty path, which would put the run's files in (or read them from) the "
                f"current folder. Pass a folder or file name, or leave {flag} out for its default."
            )
