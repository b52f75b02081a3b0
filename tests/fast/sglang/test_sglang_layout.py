"""HF tensors in SGLang's layout and SGLang's per-tensor digest, against hand-built references (the e2e test
tests/e2e/test_sglang_engine.py checks the same table against SGLang's own checker)."""

import hashlib

import pytest
import torch
from transformers import Qwen3ForCausalLM

from miles.rollout.sglang_layout import check_held_weights, sglang_digests, tensor_digest, to_sglang_layout
from miles.utils.errors import OffPolicyGuardError
from tests.tiny_qwen3 import qwen3_config


def _qwen2_like(vocab=15, hidden=4, tied=True):
    torch.manual_seed(0)
    prefix = "model.layers.0."
    names = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for module, rows in (("q", 4), ("k", 2), ("v", 2)):
        names[f"{prefix}self_attn.{module}_proj.weight"] = (rows, hidden)
        names[f"{prefix}self_attn.{module}_proj.bias"] = (rows,)
    names[f"{prefix}self_attn.o_proj.weight"] = (hidden, hidden)
    for module in ("gate", "up"):
        names[f"{prefix}mlp.{module}_proj.weight"] = (6, hidden)
    names[f"{prefix}mlp.down_proj.weight"] = (hidden, 6)
    state = {name: torch.randn(shape) for name, shape in names.items()}
    state["lm_head.weight"] = state["model.embed_tokens.weight"] if tied else torch.randn(vocab, hidden)
    return state


def test_fused_padded_and_tied_tensors_are_laid_out_as_sglang_holds_them():
    state = _qwen2_like()
    layout = to_sglang_layout(state, tied_embeddings=True)
    p = "model.layers.0."
    assert sorted(layout) == sorted([
        "model.embed_tokens.weight", "model.norm.weight", f"{p}self_attn.qkv_proj.weight", f"{p}self_attn.qkv_proj.bias",
        f"{p}self_attn.o_proj.weight", f"{p}mlp.gate_up_proj.weight", f"{p}mlp.down_proj.weight"])
    qkv = layout[f"{p}self_attn.qkv_proj.weight"]
    assert qkv.shape == (8, 4)
    assert torch.equal(qkv[0:4], state[f"{p}self_attn.q_proj.weight"])
    assert torch.equal(qkv[4:6], state[f"{p}self_attn.k_proj.weight"])
    assert torch.equal(qkv[6:8], state[f"{p}self_attn.v_proj.weight"])
    gate_up = layout[f"{p}mlp.gate_up_proj.weight"]
    assert torch.equal(gate_up[:6], state[f"{p}mlp.gate_proj.weight"]) and torch.equal(gate_up[6:], state[f"{p}mlp.up_proj.weight"])
    embed = layout["model.embed_tokens.weight"]
    assert embed.shape == (64, 4) and torch.equal(embed[:15], state["model.embed_tokens.weight"])
    assert not embed[15:].any()


def test_a_qwen3_state_keeps_its_qk_norms_and_fuses_qkv_without_bias():
    """SGLang's Qwen3 (sglang/srt/models/qwen3.py, 0.5.23) holds self_attn.qkv_proj (a bias only with attention_bias),
    self_attn.q_norm / k_norm under the HF names, and mlp.gate_up_proj: Qwen2's layout plus the two norms."""
    torch.manual_seed(0)
    state = Qwen3ForCausalLM(qwen3_config(num_hidden_layers=1)).state_dict()
    layout = to_sglang_layout(state, tied_embeddings=False)
    p = "model.layers.0."
    assert sorted(layout) == sorted([
        "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", f"{p}input_layernorm.weight",
        f"{p}post_attention_layernorm.weight", f"{p}self_attn.qkv_proj.weight", f"{p}self_attn.o_proj.weight",
        f"{p}self_attn.q_norm.weight", f"{p}self_attn.k_norm.weight", f"{p}mlp.gate_up_proj.weight",
        f"{p}mlp.down_proj.weight"])
    assert layout[f"{p}self_attn.qkv_proj.weight"].shape == ((4 + 2 + 2) * 16, 32)  # q, k, v heads x head_dim 16
    assert layout[f"{p}self_attn.q_norm.weight"] is state[f"{p}self_attn.q_norm.weight"]


def test_an_untied_lm_head_is_kept_and_padded():
    layout = to_sglang_layout(_qwen2_like(vocab=70, tied=False), tied_embeddings=False)
    assert layout["lm_head.weight"].shape == (128, 4) and layout["model.embed_tokens.weight"].shape == (128, 4)


def test_a_missing_part_of_a_fused_tensor_is_named():
    state = _qwen2_like()
    del state["model.layers.0.self_attn.k_proj.weight"]
    with pytest.raises(ValueError, match=r"qkv_proj.weight: the state dict lacks \['model.layers.0.self_attn.k_proj"):
        to_sglang_layout(state, tied_embeddings=True)


def test_the_digest_is_the_first_8_bytes_of_sha256_over_the_raw_bytes():
    # 1.0 and -2.0 in float32, little-endian, written out by hand
    raw = b"\x00\x00\x80\x3f" + b"\x00\x00\x00\xc0"
    assert tensor_digest(torch.tensor([1.0, -2.0])) == hashlib.sha256(raw).hexdigest()[:16]
    # bfloat16 1.0 is 0x3f80; a non-contiguous view hashes its values in order
    assert tensor_digest(torch.tensor([1.0], dtype=torch.bfloat16)) == hashlib.sha256(b"\x80\x3f").hexdigest()[:16]
    matrix = torch.tensor([[1.0, 3.0], [-2.0, 4.0]])
    assert tensor_digest(matrix.t()[0]) == hashlib.sha256(raw).hexdigest()[:16]


def test_digests_follow_the_engine_dtype_and_change_with_one_ulp():
    state = _qwen2_like()
    fp32, bf16 = sglang_digests(state, torch.float32, True), sglang_digests(state, torch.bfloat16, True)
    assert fp32.keys() == bf16.keys() and all(fp32[n] != bf16[n] for n in fp32)
    name = "model.norm.weight"
    nudged = dict(state, **{name: torch.nextafter(state[name], torch.full_like(state[name], float("inf")))})
    changed = sglang_digests(nudged, torch.float32, True)
    assert [n for n in fp32 if fp32[n] != changed[n]] == [name]


def test_held_weights_must_equal_the_pushed_table():
    expected = {"a": "1", "b": "2"}
    check_held_weights("engine 0, weight version 3", expected, dict(expected))
    with pytest.raises(OffPolicyGuardError, match=r"engine 0, weight version 3: .* 1 tensor\(s\) differ \(\['b'\]\)"):
        check_held_weights("engine 0, weight version 3", expected, {"a": "1", "b": "9"})
    with pytest.raises(OffPolicyGuardError, match=r"1 pushed but not held \(\['b'\]\), 1 held but not pushed \(\['c'\]\)"):
        check_held_weights("engine 0, weight version 3", expected, {"a": "1", "c": "2"})
