"""HF Qwen2/Qwen3 <-> Megatron conversion: bit-exact round trips, and the fused layouts checked against hand-built
rows."""

import pytest
import torch
from transformers import (
    LlamaConfig,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForTokenClassification,
    Qwen3ForCausalLM,
    Qwen3ForTokenClassification,
)

from miles.backends.megatron_backend.qwen2 import FAMILIES, Qwen2Layout, hf_to_megatron, megatron_to_hf
from miles.backends.megatron_backend.support import SUPPORTED_MODEL_TYPES
from miles.models.hf import load_causal_lm
from tests.tiny_qwen3 import qwen3_config


def _random_gqa_config(tied: bool) -> Qwen2Config:
    # 4 query heads in 2 KV groups, head_dim 4, untied embeddings (unless asked): every fused layout is exercised.
    return Qwen2Config(vocab_size=13, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                       tie_word_embeddings=tied, num_labels=1)


def _assert_bit_exact_round_trip(hf_model, role: str) -> None:
    layout = Qwen2Layout.from_hf_config(hf_model.config, role)
    original = hf_model.state_dict()
    back = megatron_to_hf(hf_to_megatron(original, layout), layout)
    assert set(back) == set(original)
    for name, tensor in original.items():
        assert torch.equal(back[name], tensor), name


def test_round_trip_is_bit_exact_on_the_embedded_default(embedded):
    _assert_bit_exact_round_trip(load_causal_lm(embedded.checkpoint_dir), "actor")


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_round_trip_is_bit_exact_on_a_random_gqa_qwen2(tied):
    torch.manual_seed(0)
    _assert_bit_exact_round_trip(Qwen2ForCausalLM(_random_gqa_config(tied)), "actor")


def test_round_trip_is_bit_exact_for_the_critic():
    torch.manual_seed(0)
    critic = Qwen2ForTokenClassification(_random_gqa_config(tied=True))  # a critic never ties its score head
    _assert_bit_exact_round_trip(critic, "critic")
    megatron = hf_to_megatron(critic.state_dict(), Qwen2Layout.from_hf_config(critic.config, "critic"))
    assert torch.equal(megatron["output_layer.bias"], critic.score.bias)


def _layout(**overrides) -> Qwen2Layout:
    fields = dict(num_layers=1, num_heads=4, num_query_groups=2, head_dim=1, tied_embeddings=True, role="actor")
    return Qwen2Layout(**{**fields, **overrides})


def _hand_built_hf_state() -> dict[str, torch.Tensor]:
    """Hidden size 1, so each row of a projection is one number that names it."""

    def rows(*values):
        return torch.tensor(values, dtype=torch.float32).reshape(-1, 1)

    return {
        "model.embed_tokens.weight": torch.ones(3, 1), "model.norm.weight": torch.ones(1),
        "lm_head.weight": torch.ones(3, 1),
        "model.layers.0.input_layernorm.weight": torch.ones(1),
        "model.layers.0.post_attention_layernorm.weight": torch.ones(1),
        "model.layers.0.self_attn.o_proj.weight": torch.ones(1, 4),
        "model.layers.0.mlp.down_proj.weight": torch.ones(1, 2),
        # q: heads 0..3 (head_dim 1); k, v: groups 0, 1
        "model.layers.0.self_attn.q_proj.weight": rows(0, 1, 2, 3),
        "model.layers.0.self_attn.k_proj.weight": rows(10, 11),
        "model.layers.0.self_attn.v_proj.weight": rows(20, 21),
        "model.layers.0.self_attn.q_proj.bias": torch.tensor([0.5, 1.5, 2.5, 3.5]),
        "model.layers.0.self_attn.k_proj.bias": torch.tensor([10.5, 11.5]),
        "model.layers.0.self_attn.v_proj.bias": torch.tensor([20.5, 21.5]),
        "model.layers.0.mlp.gate_proj.weight": rows(100, 101),
        "model.layers.0.mlp.up_proj.weight": rows(200, 201),
    }


def test_qkv_is_fused_per_query_group_and_fc1_is_gate_then_up():
    megatron = hf_to_megatron(_hand_built_hf_state(), _layout())
    # group 0: q heads 0, 1, then k_0, v_0; group 1: q heads 2, 3, then k_1, v_1
    assert megatron["decoder.layers.0.self_attention.linear_qkv.weight"].flatten().tolist() == [
        0, 1, 10, 20, 2, 3, 11, 21]
    assert megatron["decoder.layers.0.self_attention.linear_qkv.bias"].tolist() == [
        0.5, 1.5, 10.5, 20.5, 2.5, 3.5, 11.5, 21.5]
    assert megatron["decoder.layers.0.mlp.linear_fc1.weight"].flatten().tolist() == [100, 101, 200, 201]
    assert "output_layer.weight" not in megatron  # tied: the output layer is the embedding


def test_a_tensor_outside_the_table_is_refused_not_dropped():
    state = {**_hand_built_hf_state(), "model.layers.0.self_attn.rotary_extra": torch.ones(1)}
    with pytest.raises(KeyError, match="rotary_extra"):
        hf_to_megatron(state, _layout())
    missing = _hand_built_hf_state()
    del missing["model.layers.0.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match="up_proj"):
        hf_to_megatron(missing, _layout())


# Qwen3: q_norm/k_norm instead of q/k/v biases, and a head_dim (16) that is not hidden_size / heads (8).


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_round_trip_is_bit_exact_on_a_random_qwen3(tied):
    torch.manual_seed(0)
    _assert_bit_exact_round_trip(Qwen3ForCausalLM(qwen3_config(tie_word_embeddings=tied)), "actor")


def test_round_trip_is_bit_exact_for_a_qwen3_critic():
    torch.manual_seed(0)
    _assert_bit_exact_round_trip(Qwen3ForTokenClassification(qwen3_config()), "critic")


def test_qwen3_norms_map_one_to_one_and_its_qkv_has_no_bias():
    torch.manual_seed(0)
    hf = Qwen3ForCausalLM(qwen3_config()).state_dict()
    layout = Qwen2Layout.from_hf_config(qwen3_config(), "actor")
    assert (layout.qkv_bias, layout.qk_layernorm, layout.head_dim) == (False, True, 16)
    megatron = hf_to_megatron(hf, layout)
    for i in range(2):
        for hf_norm, megatron_norm in (("q_norm", "q_layernorm"), ("k_norm", "k_layernorm")):
            assert torch.equal(megatron[f"decoder.layers.{i}.self_attention.{megatron_norm}.weight"],
                               hf[f"model.layers.{i}.self_attn.{hf_norm}.weight"])
        assert f"decoder.layers.{i}.self_attention.linear_qkv.bias" not in megatron
        # 2 groups x (2 q heads + k + v) x head_dim 16 rows, from hidden 32
        assert megatron[f"decoder.layers.{i}.self_attention.linear_qkv.weight"].shape == (2 * 4 * 16, 32)


def test_a_qwen3_state_with_qkv_biases_is_refused_not_dropped():
    torch.manual_seed(0)
    state = {**Qwen3ForCausalLM(qwen3_config()).state_dict(), "model.layers.0.self_attn.q_proj.bias": torch.ones(64)}
    with pytest.raises(KeyError, match="q_proj.bias"):
        hf_to_megatron(state, Qwen2Layout.from_hf_config(qwen3_config(), "actor"))


def test_a_family_without_a_table_is_refused():
    with pytest.raises(ValueError, match="'llama'"):
        Qwen2Layout.from_hf_config(LlamaConfig(), "actor")


def test_the_preflight_knows_exactly_the_families_with_a_table():
    assert SUPPORTED_MODEL_TYPES == tuple(FAMILIES)
