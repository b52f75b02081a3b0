"""Hugging Face Qwen2 and Qwen3 <-> Megatron GPTModel weights: a table of names plus two fused layouts, both ways.

The two families differ only in data (``FAMILIES``), as in upstream's ``megatron_to_hf/qwen2.py``, which serves
both: Qwen2 has q/k/v biases; Qwen3 has none (``attention_bias`` false) but a per-head RMSNorm of the queries and
keys (``q_norm``/``k_norm``, Megatron's ``q_layernorm``/``k_layernorm`` under ``--qk-layernorm``) and an explicit
``head_dim`` that may differ from ``hidden_size / num_attention_heads``.

One-to-one tensors are the tables ``GLOBAL``, ``PER_LAYER`` and, for Qwen3, ``QK_NORMS`` (``{i}`` is the layer
index). Two Megatron tensors fuse several HF ones:

- ``self_attention.linear_qkv`` (weight, and bias in Qwen2) holds q, k and v grouped per query group (KV head) g:
  the q rows of g's ``heads_per_group`` heads, then k_g, then v_g, each ``head_dim`` rows per head;
- ``mlp.linear_fc1`` is ``cat(gate_proj, up_proj)`` (SwiGLU: Megatron splits it in two halves, gate first).

The head is the causal LM's ``lm_head`` (absent in Megatron when the embeddings are tied: the HF state dict still
lists it, as the same tensor as ``embed_tokens``) or the critic's ``score`` (weight and bias), both Megatron's
``output_layer``. Layouts here are whole (tensor-parallel size 1); a rank of a TP group shards after converting.
Conversion moves elements without arithmetic, so HF -> Megatron -> HF is bit-exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

GLOBAL = (
    ("model.embed_tokens.weight", "embedding.word_embeddings.weight"),
    ("model.norm.weight", "decoder.final_layernorm.weight"),
)
PER_LAYER = (
    ("model.layers.{i}.input_layernorm.weight", "decoder.layers.{i}.input_layernorm.weight"),
    ("model.layers.{i}.self_attn.o_proj.weight", "decoder.layers.{i}.self_attention.linear_proj.weight"),
    ("model.layers.{i}.post_attention_layernorm.weight", "decoder.layers.{i}.pre_mlp_layernorm.weight"),
    ("model.layers.{i}.mlp.down_proj.weight", "decoder.layers.{i}.mlp.linear_fc2.weight"),
)
QK_NORMS = (  # Qwen3: RMSNorm over head_dim, one weight shared by every head, before RoPE in both models
    ("model.layers.{i}.self_attn.q_norm.weight", "decoder.layers.{i}.self_attention.q_layernorm.weight"),
    ("model.layers.{i}.self_attn.k_norm.weight", "decoder.layers.{i}.self_attention.k_layernorm.weight"),
)
HF_ATTENTION = "model.layers.{i}.self_attn.{proj}_proj.{kind}"  # proj in q, k, v; kind in weight, bias
MEGATRON_QKV = "decoder.layers.{i}.self_attention.linear_qkv.{kind}"
HF_MLP = "model.layers.{i}.mlp.{proj}_proj.weight"  # proj in gate, up
MEGATRON_FC1 = "decoder.layers.{i}.mlp.linear_fc1.weight"
HF_HEADS = {"actor": "lm_head", "critic": "score"}  # causal LM / token-classification critic
MEGATRON_HEAD = "output_layer"


@dataclass(frozen=True)
class Family:
    qkv_bias: bool  # q_proj/k_proj/v_proj have biases (Megatron's add_qkv_bias)
    qk_layernorm: bool  # q_norm/k_norm (Megatron's qk_layernorm)


FAMILIES = {"qwen2": Family(qkv_bias=True, qk_layernorm=False), "qwen3": Family(qkv_bias=False, qk_layernorm=True)}


@dataclass(frozen=True)
class Qwen2Layout:
    """The shape facts the conversion needs, read from a Hugging Face Qwen2 or Qwen3 config."""

    num_layers: int
    num_heads: int
    num_query_groups: int
    head_dim: int
    tied_embeddings: bool  # the causal LM's lm_head is embed_tokens
    role: str  # "actor" (causal LM) or "critic" (token classification, scalar head with bias)
    qkv_bias: bool = True
    qk_layernorm: bool = False

    @classmethod
    def from_hf_config(cls, config, role: str) -> Qwen2Layout:
        if config.model_type not in FAMILIES:
            raise ValueError(f"model_type {config.model_type!r} has no conversion table (known: {', '.join(FAMILIES)})")
        family = FAMILIES[config.model_type]
        return cls(
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            num_query_groups=config.num_key_value_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
            tied_embeddings=bool(config.tie_word_embeddings) and role == "actor",
            role=role,
            qkv_bias=family.qkv_bias,
            qk_layernorm=family.qk_layernorm,
        )

    @property
    def qkv_kinds(self) -> tuple[str, ...]:
        return ("weight", "bias") if self.qkv_bias else ("weight",)

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_query_groups

    def one_to_one_names(self) -> list[tuple[str, str]]:
        """(HF name, Megatron name) of every tensor that maps as it is: the tables, per layer, and the output head
        (none for a tied causal LM)."""
        names = list(GLOBAL)
        per_layer = PER_LAYER + QK_NORMS if self.qk_layernorm else PER_LAYER
        for i in range(self.num_layers):
            names += [(hf_name.format(i=i), megatron_name.format(i=i)) for hf_name, megatron_name in per_layer]
        if not self.tied_embeddings:
            kinds = ("weight", "bias") if self.role == "critic" else ("weight",)
            names += [(f"{HF_HEADS[self.role]}.{kind}", f"{MEGATRON_HEAD}.{kind}") for kind in kinds]
        return names


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Qwen2Layout) -> torch.Tensor:
    """q (heads * d, ...), k and v (groups * d, ...) -> (groups * (heads_per_group + 2) * d, ...), per group."""
    groups, d, rest = layout.num_query_groups, layout.head_dim, q.shape[1:]
    per_group = torch.cat(
        [q.reshape(groups, layout.heads_per_group * d, *rest), k.reshape(groups, d, *rest), v.reshape(groups, d, *rest)],
        dim=1,
    )
    return per_group.reshape(-1, *rest)


def _split_qkv(qkv: torch.Tensor, layout: Qwen2Layout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of ``_fuse_qkv``."""
    groups, d, rest = layout.num_query_groups, layout.head_dim, qkv.shape[1:]
    per_group = qkv.reshape(groups, (layout.heads_per_group + 2) * d, *rest)
    q, k, v = per_group.split([layout.heads_per_group * d, d, d], dim=1)
    return q.reshape(-1, *rest).clone(), k.reshape(-1, *rest).clone(), v.reshape(-1, *rest).clone()


class _Consumer:
    """Reads a state dict by name and, at the end, refuses names the conversion did not use."""

    def __init__(self, state: Mapping[str, object], what: str) -> None:
        self._state = {name: value for name, value in state.items() if torch.is_tensor(value)}
        self._unused = set(self._state)
        self._what = what

    def __call__(self, name: str) -> torch.Tensor:
        if name not in self._state:
            raise KeyError(f"the {self._what} state dict has no {name!r}: it is not the Qwen2/Qwen3 layout miles "
                           "converts")
        self._unused.discard(name)
        return self._state[name]

    def discard(self, name: str) -> None:
        self._unused.discard(name)

    def check_all_used(self) -> None:
        if self._unused:
            raise KeyError(f"the {self._what} state dict has tensors miles cannot convert: {sorted(self._unused)}")


def hf_to_megatron(hf_state: Mapping[str, torch.Tensor], layout: Qwen2Layout) -> dict[str, torch.Tensor]:
    """Megatron GPTModel tensors (new tensors) from a Hugging Face Qwen2 or Qwen3 state dict."""
    take = _Consumer(hf_state, "Hugging Face")
    out = {megatron_name: take(hf_name).clone() for hf_name, megatron_name in layout.one_to_one_names()}
    for i in range(layout.num_layers):
        for kind in layout.qkv_kinds:
            q, k, v = (take(HF_ATTENTION.format(i=i, proj=proj, kind=kind)) for proj in "qkv")
            out[MEGATRON_QKV.format(i=i, kind=kind)] = _fuse_qkv(q, k, v, layout)
        gate, up = (take(HF_MLP.format(i=i, proj=proj)) for proj in ("gate", "up"))
        out[MEGATRON_FC1.format(i=i)] = torch.cat([gate, up], dim=0)
    if layout.tied_embeddings:
        take.discard("lm_head.weight")  # the same tensor as embed_tokens
    take.check_all_used()
    return out


def megatron_to_hf(megatron_state: Mapping[str, object], layout: Qwen2Layout) -> dict[str, torch.Tensor]:
    """Hugging Face Qwen2 or Qwen3 tensors (new tensors, the HF state dict's names) from Megatron GPTModel's state dict.

    Megatron's non-tensor ``_extra_state`` entries are skipped. A tied causal LM gets ``lm_head.weight`` as a copy
    of the embeddings, as ``state_dict()`` of the HF model lists it (the engines fingerprint that state dict).
    """
    take = _Consumer(megatron_state, "Megatron")
    out = {hf_name: take(megatron_name).clone() for hf_name, megatron_name in layout.one_to_one_names()}
    for i in range(layout.num_layers):
        for kind in layout.qkv_kinds:
            q, k, v = _split_qkv(take(MEGATRON_QKV.format(i=i, kind=kind)), layout)
            for proj, tensor in zip("qkv", (q, k, v), strict=True):
                out[HF_ATTENTION.format(i=i, proj=proj, kind=kind)] = tensor
        gate, up = take(MEGATRON_FC1.format(i=i)).chunk(2, dim=0)
        out[HF_MLP.format(i=i, proj="gate")], out[HF_MLP.format(i=i, proj="up")] = gate.clone(), up.clone()
    if layout.tied_embeddings:
        out["lm_head.weight"] = out["model.embed_tokens.weight"].clone()
    take.check_all_used()
    return out
