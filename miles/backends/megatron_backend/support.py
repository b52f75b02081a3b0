"""What the megatron backend can train, checked in the driver's process before Ray starts.

Reads the Hugging Face ``config.json`` as JSON and looks megatron-core up without importing it, so a launch it
cannot serve ends with one ``error:`` line (exit 2) and costs no actor start-up.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from miles.utils.errors import MilesConfigError

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3")  # the families with a conversion table (qwen2.py FAMILIES)


def check_megatron_backend(hf_checkpoint: str, tensor_parallel_size: int = 1) -> None:
    """Raise ``MilesConfigError`` unless megatron-core is installed and the checkpoint's model can be converted
    (and split over ``tensor_parallel_size`` ranks)."""
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        raise MilesConfigError(
            "--train-backend megatron (the default, as upstream's) needs megatron-core, which is not installed. "
            "Install the extra (pip install -e '.[megatron]'; scripts/setup.sh does), or pass --train-backend torch."
        )
    config = json.loads((Path(hf_checkpoint).expanduser() / "config.json").read_text())
    for problem in _unsupported(config) + _not_divisible(config, tensor_parallel_size):
        raise MilesConfigError(f"--train-backend megatron with --hf-checkpoint {hf_checkpoint!r}: {problem}")


def _unsupported(config: dict) -> list[str]:
    """Each thing the backend cannot do with this config, as 'value, rule, fix'."""
    fix = "Use --train-backend torch, which trains any Hugging Face causal LM."
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        return [f"model_type is {model_type!r}, but the backend converts only {', '.join(SUPPORTED_MODEL_TYPES)} "
                f"models (miles/backends/megatron_backend/qwen2.py). {fix}"]
    problems = []
    if model_type == "qwen3" and config.get("attention_bias"):
        problems.append("attention_bias is true, but the backend converts Qwen3 without attention biases (the bias "
                        f"of o_proj would need Megatron's add_bias_linear, which also adds MLP biases). {fix}")
    if config.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act is {config['hidden_act']!r}, but the backend builds a SwiGLU (silu) MLP. {fix}")
    if config.get("use_sliding_window"):
        problems.append(f"use_sliding_window is set, but the backend has no sliding-window attention. {fix}")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        problems.append(f"RoPE type {rope.get('rope_type', rope.get('type'))!r} is not supported (only the default "
                        f"RoPE). {fix}")
    if config["num_attention_heads"] % config.get("num_key_value_heads", config["num_attention_heads"]):
        problems.append(f"num_attention_heads {config['num_attention_heads']} is not a multiple of "
                        f"num_key_value_heads {config['num_key_value_heads']}. {fix}")
    return problems


def _not_divisible(config: dict, tensor_parallel_size: int) -> list[str]:
    """Tensor parallelism splits attention heads, query groups and the MLP's hidden units evenly over the ranks.
    The vocabulary needs no rule: the backend pads it to a multiple of the tensor-parallel size."""
    if tensor_parallel_size == 1:
        return []
    sizes = {"num_attention_heads": config["num_attention_heads"],
             "num_key_value_heads (query groups)": config.get("num_key_value_heads", config["num_attention_heads"]),
             "intermediate_size (FFN)": config["intermediate_size"]}
    return [f"{name} is {size}, which --tensor-model-parallel-size {tensor_parallel_size} does not divide (each rank "
            f"takes an equal share). Pick a tensor-parallel size dividing {size}."
            for name, size in sizes.items() if size % tensor_parallel_size]
