"""Megatron's model-architecture flags, checked against the checkpoint.

Upstream's launchers pass them (``scripts/models/*.sh``) and upstream builds its Megatron model from them, so they
must agree with the Hugging Face checkpoint the weights come from. miles builds the model from the checkpoint's
config.json on both backends, so a flag given on the command line is a claim about the checkpoint: the preflight
checks each one given (``architecture_mismatches``) and a disagreement stops the launch in one line naming both
values. A flag left out claims nothing. Standard library only: the expected values come from config.json and the
weights' tensor names.

In configuration because the parser reads its flag table (``GROUPS_FLAGS``, ``DESTS``); the preflight
(``miles.ray.preflight``) calls the check.
"""

from __future__ import annotations

# (dest, flag, the checkpoint field it must agree with), in upstream's scripts/models order
FLAGS = (
    ("num_layers", "--num-layers", "num_hidden_layers"),
    ("hidden_size", "--hidden-size", "hidden_size"),
    ("ffn_hidden_size", "--ffn-hidden-size", "intermediate_size"),
    ("num_attention_heads", "--num-attention-heads", "num_attention_heads"),
    ("kv_channels", "--kv-channels", "head_dim (default hidden_size / num_attention_heads)"),
    ("vocab_size", "--vocab-size", "vocab_size"),
    ("normalization", "--normalization", "normalization (RMSNorm when config.json has rms_norm_eps)"),
    ("layernorm_epsilon", "--norm-epsilon", "rms_norm_eps (or layer_norm_eps)"),
    ("swiglu", "--swiglu", "hidden_act silu (a SwiGLU MLP)"),
    ("position_embedding_type", "--position-embedding-type", "position embedding (rope when it has rope_theta)"),
    ("use_rotary_position_embeddings", "--use-rotary-position-embeddings", "rope_theta (rotary embeddings)"),
    ("rotary_base", "--rotary-base", "rope_theta"),
    ("rotary_percent", "--rotary-percent", "partial_rotary_factor (default 1.0)"),
    ("untie_embeddings_and_output_weights", "--untie-embeddings-and-output-weights", "untied embeddings "
                                                                                       "(tie_word_embeddings false)"),
    ("add_bias_linear", "--disable-bias-linear", "biases of the output projection and MLP (their .bias tensors)"),
    ("add_qkv_bias", "--add-qkv-bias", "q/k/v projection biases (q_proj.bias tensors)"),
    ("qk_layernorm", "--qk-layernorm", "query/key norms (q_norm tensors)"),
)
DESTS = tuple(dest for dest, _, _ in FLAGS)
GROUPS_FLAGS = ("group_query_attention", "num_query_groups")  # checked together: the key-value heads they mean
_LINEAR_BIASES = ("o_proj.bias", "gate_proj.bias", "up_proj.bias", "down_proj.bias", "dense.bias", "fc1.bias")


def checkpoint_architecture(config: dict, weight_names: set[str]) -> dict:
    """The value each flag's dest must have to describe this checkpoint (Megatron's meaning of each flag)."""
    heads = config.get("num_attention_heads")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_theta = config.get("rope_theta", rope.get("rope_theta"))
    return {
        "num_layers": config.get("num_hidden_layers"),
        "hidden_size": config.get("hidden_size"),
        "ffn_hidden_size": config.get("intermediate_size"),
        "num_attention_heads": heads,
        "kv_channels": config.get("head_dim") or (config["hidden_size"] // heads if heads else None),
        "vocab_size": config.get("vocab_size"),
        "normalization": "RMSNorm" if "rms_norm_eps" in config else "LayerNorm",
        "layernorm_epsilon": config.get("rms_norm_eps", config.get("layer_norm_eps")),
        "swiglu": config.get("hidden_act") == "silu",
        "position_embedding_type": "rope" if rope_theta is not None else "learned_absolute",
        "use_rotary_position_embeddings": rope_theta is not None,
        "rotary_base": rope_theta,
        "rotary_percent": config.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0)),
        "untie_embeddings_and_output_weights": not config.get("tie_word_embeddings", True),
        "add_bias_linear": any(name.endswith(_LINEAR_BIASES) for name in weight_names),
        "add_qkv_bias": any(name.endswith("q_proj.bias") for name in weight_names),
        "qk_layernorm": any(".q_norm." in name or ".q_layernorm." in name for name in weight_names),
        "num_key_value_heads": config.get("num_key_value_heads", heads),
    }


def architecture_mismatches(given: dict, expected: dict) -> list[str]:
    """One phrase per flag in ``given`` (dest -> value, the flags the launch passed) that disagrees with
    ``expected`` (``checkpoint_architecture``), naming the flag's value and the checkpoint's."""
    problems = []
    for dest, flag, field in FLAGS:
        if dest in given and not _same(given[dest], expected[dest]):
            problems.append(f"{_shown(flag, given[dest])} but the checkpoint's {field} is {expected[dest]!r}")
    if any(dest in given for dest in GROUPS_FLAGS):
        # Megatron: --num-query-groups counts the key-value heads only under --group-query-attention
        gqa = given.get("group_query_attention", False)
        groups = given.get("num_query_groups", 1) if gqa else given.get("num_attention_heads",
                                                                         expected["num_attention_heads"])
        if groups != expected["num_key_value_heads"]:
            words = (f"--group-query-attention --num-query-groups {given.get('num_query_groups', 1)}" if gqa
                     else f"--num-query-groups {given['num_query_groups']} without --group-query-attention")
            problems.append(f"{words} means {groups} key-value heads but the checkpoint's num_key_value_heads is "
                            f"{expected['num_key_value_heads']!r}")
    return problems


def _same(value, expected) -> bool:
    if isinstance(value, bool) or isinstance(expected, bool) or value is None or expected is None:
        return value == expected
    if isinstance(value, (int, float)) and isinstance(expected, (int, float)):
        return float(value) == float(expected)
    return value == expected


def _shown(flag: str, value) -> str:
    """The flag as the launch wrote it: a switch alone, a value after its flag."""
    return flag if isinstance(value, bool) else f"{flag} {value}"
