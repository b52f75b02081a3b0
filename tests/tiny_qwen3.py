"""A tiny random Qwen3 checkpoint, made locally for tests (nothing downloaded).

It exercises what Qwen3 adds to Qwen2: per-head q/k RMSNorm (``q_norm``/``k_norm``), no q/k/v biases, and an
explicit ``head_dim`` (16) that differs from ``hidden_size / num_attention_heads`` (32 / 4 = 8); grouped-query
attention (4 heads, 2 KV groups) and untied embeddings. It uses the embedded default's tokenizer (15 tokens), so
a rollout engine and a training run can load the folder like any HF checkpoint. Its norm weights are random around
1 (transformers initializes them to ones), so a swapped or skipped q/k norm changes the logits.

Its config names no ``pad_token_id``, as the released Qwen3 configs do not: transformers would otherwise build the
embedding with ``padding_idx`` and never train that row, while Megatron (upstream's trainer) trains every row; the
random model does sample the tokenizer's ``<pad>`` (id 0) as a response token, where the two would differ
(docs/megatron.md, "Measured").
"""

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM


def qwen3_config(**overrides) -> Qwen3Config:
    fields = dict(vocab_size=15, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=64, tie_word_embeddings=False,
                  rope_theta=500.0, num_labels=1, pad_token_id=None, bos_token_id=1, eos_token_id=2)
    return Qwen3Config(**{**fields, **overrides})


def save_tiny_qwen3(folder: Path, tokenizer_dir: str, seed: int = 0) -> str:
    """Write a seeded random tiny Qwen3 (fp32) and the tokenizer of ``tokenizer_dir`` into ``folder``."""
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(qwen3_config()).to(torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.5 * torch.randn_like(param))
    model.save_pretrained(folder)
    PreTrainedTokenizerFast.from_pretrained(tokenizer_dir).save_pretrained(folder)
    return str(folder)
