"""The Megatron model-architecture flags: each one a launch passes must agree with the checkpoint, checked before Ray
starts in one line naming both values; a flag left out claims nothing."""

from pathlib import Path

import pytest

from miles.config.architecture import architecture_mismatches, checkpoint_architecture
from miles.config.arguments import parse_args
from miles.ray.preflight import check_architecture_flags
from miles.utils.errors import MilesConfigError

# Qwen2.5-0.5B's config.json (the fields read) and the tensor names that matter, written out by hand.
QWEN25_05B = {"num_hidden_layers": 24, "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
              "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
              "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu", "tie_word_embeddings": True}
QWEN2_TENSORS = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.bias",
                 "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight"}
# upstream's scripts/models/qwen2.5-0.5B.sh, parsed by miles' parser
QWEN25_05B_SCRIPT = ["--swiglu", "--num-layers", "24", "--hidden-size", "896", "--ffn-hidden-size", "4864",
                     "--num-attention-heads", "14", "--use-rotary-position-embeddings", "--disable-bias-linear",
                     "--add-qkv-bias", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--rotary-base",
                     "1000000", "--group-query-attention", "--num-query-groups", "2", "--vocab-size", "151936"]


def _given(words):
    return parse_args(argv=words).architecture_given


def test_upstreams_model_script_agrees_with_its_checkpoint():
    given = _given(QWEN25_05B_SCRIPT)
    assert len(given) == 14  # every flag of the script is recorded as given, none of the others
    assert architecture_mismatches(given, checkpoint_architecture(QWEN25_05B, QWEN2_TENSORS)) == []


@pytest.mark.parametrize(
    ("words", "phrase"),
    [(["--hidden-size", "1024"], "--hidden-size 1024 but the checkpoint's hidden_size is 896"),
     (["--rotary-base", "10000"], "--rotary-base 10000 but the checkpoint's rope_theta is 1000000.0"),
     (["--normalization", "LayerNorm"], "--normalization LayerNorm but the checkpoint's normalization (RMSNorm"),
     (["--untie-embeddings-and-output-weights"], "--untie-embeddings-and-output-weights but the checkpoint's untied"),
     (["--qk-layernorm"], "--qk-layernorm but the checkpoint's query/key norms (q_norm tensors) is False"),
     (["--group-query-attention", "--num-query-groups", "4"],
      "--group-query-attention --num-query-groups 4 means 4 key-value heads but the checkpoint's "
      "num_key_value_heads is 2"),
     (["--num-query-groups", "2"],  # without --group-query-attention Megatron gives every head its own keys
      "--num-query-groups 2 without --group-query-attention means 14 key-value heads")],
)
def test_each_disagreement_names_the_flags_value_and_the_checkpoints(words, phrase):
    problems = architecture_mismatches(_given(words), checkpoint_architecture(QWEN25_05B, QWEN2_TENSORS))
    assert len(problems) == 1 and phrase in problems[0]


def test_a_flag_left_at_upstreams_default_claims_nothing():
    # --normalization's default is LayerNorm and --rotary-base's 10000, both wrong for this checkpoint: not passed,
    # they are not checked
    assert _given([]) == {}


def test_linear_biases_are_read_from_the_tensor_names():
    with_bias = QWEN2_TENSORS | {"model.layers.0.self_attn.o_proj.bias"}
    problems = architecture_mismatches(_given(["--disable-bias-linear"]), checkpoint_architecture(QWEN25_05B, with_bias))
    assert problems == ["--disable-bias-linear but the checkpoint's biases of the output projection and MLP "
                        "(their .bias tensors) is True"]


def test_the_preflight_checks_the_embedded_checkpoint_and_stops_in_one_line(embedded):
    matching = ["--hf-checkpoint", embedded.checkpoint_dir, "--num-layers", "2", "--hidden-size", "64",
                "--ffn-hidden-size", "256", "--num-attention-heads", "4", "--kv-channels", "16", "--vocab-size", "15",
                "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--swiglu", "--rotary-base", "10000",
                "--position-embedding-type", "rope", "--disable-bias-linear", "--add-qkv-bias"]
    check_architecture_flags(parse_args(argv=matching), Path(embedded.checkpoint_dir))
    with pytest.raises(MilesConfigError) as error:
        check_architecture_flags(parse_args(argv=[*matching, "--hidden-size", "128"]), Path(embedded.checkpoint_dir))
    message = str(error.value)
    assert "\n" not in message and "--hidden-size 128 but the checkpoint's hidden_size is 64" in message


# Qwen3-0.6B's config.json (the fields read) and upstream's scripts/models/qwen3-0.6B.sh, written out by hand: 128
# channels per head (not 1024 / 16 = 64), q/k norms, no biases at all.
QWEN3_06B = {"num_hidden_layers": 28, "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-6,
             "rope_theta": 1000000, "hidden_act": "silu", "tie_word_embeddings": True, "attention_bias": False}
QWEN3_TENSORS = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_norm.weight",
                 "model.layers.0.self_attn.k_norm.weight", "model.layers.0.mlp.down_proj.weight"}
QWEN3_06B_SCRIPT = ["--swiglu", "--num-layers", "28", "--hidden-size", "1024", "--ffn-hidden-size", "3072",
                    "--num-attention-heads", "16", "--group-query-attention", "--num-query-groups", "8",
                    "--use-rotary-position-embeddings", "--disable-bias-linear", "--normalization", "RMSNorm",
                    "--norm-epsilon", "1e-6", "--rotary-base", "1000000", "--vocab-size", "151936",
                    "--kv-channels", "128", "--qk-layernorm"]


def test_upstreams_qwen3_script_agrees_with_its_checkpoint():
    assert architecture_mismatches(_given(QWEN3_06B_SCRIPT), checkpoint_architecture(QWEN3_06B, QWEN3_TENSORS)) == []


def test_the_qwen3_script_against_a_qwen2_checkpoint_names_the_query_key_norms():
    # the Qwen3 script's sizes, with a Qwen2 checkpoint's tensors (q/k/v biases, no q_norm)
    problems = architecture_mismatches(_given(["--qk-layernorm", "--kv-channels", "128"]),
                                       checkpoint_architecture(QWEN3_06B, QWEN2_TENSORS))
    assert problems == ["--qk-layernorm but the checkpoint's query/key norms (q_norm tensors) is False"]


def test_the_tiny_qwen3_checkpoint_is_read_from_its_files(qwen3_checkpoint):
    # the preflight's reading of a real folder: config.json and the safetensors' tensor names
    folder = Path(qwen3_checkpoint)
    with pytest.raises(MilesConfigError, match=r"--kv-channels 8 but the checkpoint's head_dim .* is 16"):
        check_architecture_flags(parse_args(argv=["--hf-checkpoint", qwen3_checkpoint, "--qk-layernorm",
                                                  "--kv-channels", "8"]), folder)
    check_architecture_flags(parse_args(argv=["--hf-checkpoint", qwen3_checkpoint, "--qk-layernorm",
                                              "--kv-channels", "16", "--untie-embeddings-and-output-weights"]), folder)
