"""Hugging Face tensors in SGLang's layout, and the digests SGLang's weight checker reports for them.

SGLang (0.5.23) holds a Qwen2/Qwen3/Llama-family model with q/k/v fused into ``self_attn.qkv_proj`` and gate/up
into ``mlp.gate_up_proj`` (each concatenated along dim 0, in that order; Qwen3's ``q_norm``/``k_norm`` keep their
HF names), the vocabulary rows of ``embed_tokens`` (and of
an untied ``lm_head``) zero-padded to a multiple of 64, a tied ``lm_head`` not listed (it is ``embed_tokens``), and
every tensor in the engine's dtype. Its checker (``check_weights(action="checksum")``) reports, per tensor,
``sha256(raw bytes)[:8]`` as 16 hex digits. ``sglang_digests(hf_state_dict, dtype)`` computes the same table from
the tensors the trainer pushed, so comparing it with the engine's report proves bit for bit that the engine holds
exactly what was pushed (docs/sglang.md, "What the fingerprint proves").
"""

from __future__ import annotations

import hashlib
import re

import torch

from miles.utils.errors import REPORT_BUG, OffPolicyGuardError

VOCAB_PADDING = 64  # sglang.srt.layers.vocab_parallel_embedding.DEFAULT_VOCAB_PADDING_SIZE, one tensor-parallel rank
_FUSED = {  # SGLang's fused name -> the HF names concatenated along dim 0, in order
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
_PADDED = ("model.embed_tokens.weight", "lm_head.weight")
_PART = re.compile(r"^(?P<prefix>.*\.)(?P<module>self_attn\.[qkv]_proj|mlp\.(?:gate|up)_proj)\.(?P<kind>weight|bias)$")


def to_sglang_layout(hf_state_dict: dict[str, torch.Tensor], tied_embeddings: bool) -> dict[str, torch.Tensor]:
    """The tensors SGLang holds for ``hf_state_dict`` (a Qwen2/Llama-family HF ``state_dict()``), by SGLang's names.

    fused[prefix + "self_attn.qkv_proj." + kind] = cat([q, k, v], dim 0); fused[... "mlp.gate_up_proj.weight"] =
    cat([gate, up], dim 0); embed_tokens (and an untied lm_head) gets zero rows up to a multiple of 64; a tied
    lm_head is dropped. Every other tensor keeps its name and value.
    """
    layout: dict[str, torch.Tensor] = {}
    for name, tensor in hf_state_dict.items():
        if name == "lm_head.weight" and tied_embeddings:
            continue
        part = _PART.match(name)
        if part is None:
            layout[name] = _pad_vocab(tensor) if name in _PADDED else tensor
            continue
        fused_module = next(fused for fused, parts in _FUSED.items() if part["module"] in parts)
        fused_name = f"{part['prefix']}{fused_module}.{part['kind']}"
        if fused_name not in layout:
            sources = [f"{part['prefix']}{module}.{part['kind']}" for module in _FUSED[fused_module]]
            missing = [source for source in sources if source not in hf_state_dict]
            if missing:
                raise ValueError(f"{fused_name}: the state dict lacks {missing}, so SGLang's fused tensor is unknown")
            layout[fused_name] = torch.cat([hf_state_dict[source] for source in sources], dim=0)
    return layout


def _pad_vocab(tensor: torch.Tensor) -> torch.Tensor:
    rows = -tensor.shape[0] % VOCAB_PADDING
    return torch.cat([tensor, tensor.new_zeros(rows, *tensor.shape[1:])], dim=0) if rows else tensor


def tensor_digest(tensor: torch.Tensor) -> str:
    """SGLang's per-tensor checksum: the first 8 bytes of SHA-256 over the contiguous raw bytes, as 16 hex digits
    (``sglang.srt.utils.weight_checker._hash_tensor``)."""
    raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(memoryview(raw)).hexdigest()[:16]


def sglang_digests(hf_state_dict: dict[str, torch.Tensor], dtype: torch.dtype, tied_embeddings: bool) -> dict[str, str]:
    """The table SGLang's checker reports for an engine of ``dtype`` that loaded ``hf_state_dict``: the engine
    casts each pushed tensor to its dtype on load (round to nearest, as ``Tensor.to``)."""
    layout = to_sglang_layout(hf_state_dict, tied_embeddings)
    return {name: tensor_digest(tensor.to(dtype)) for name, tensor in layout.items()}


def check_held_weights(where: str, expected: dict[str, str], held: dict[str, str]) -> None:
    """The digest table of the weights the engine holds equals the one computed from the pushed weights."""
    differ = sorted(name for name in expected.keys() & held.keys() if expected[name] != held[name])
    only_pushed, only_held = sorted(expected.keys() - held.keys()), sorted(held.keys() - expected.keys())
    if differ or only_pushed or only_held:
        raise OffPolicyGuardError(
            f"{where}: the SGLang engine does not hold the pushed weights: {len(differ)} tensor(s) differ "
            f"({differ[:3]}), {len(only_pushed)} pushed but not held ({only_pushed[:3]}), {len(only_held)} held but "
            f"not pushed ({only_held[:3]}); the engine would generate with weights the trainer never had. {REPORT_BUG}"
        )
