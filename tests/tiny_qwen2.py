"""A tiny random Qwen2 checkpoint with grouped-query attention, made locally for tests (nothing downloaded).

4 attention heads over 2 KV groups and untied embeddings, so a conversion that mixes up the KV heads or ties the
output layer to the embedding changes the logits; the layer count is the caller's (recompute needs 3 layers to leave
some out).
"""

from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def save_gqa_qwen2(folder: Path, num_hidden_layers: int, seed: int = 0) -> str:
    """Write a seeded random Qwen2 (vocabulary 15, hidden 32, GQA 4/2, untied) as an HF folder; return its path."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=15, hidden_size=32, intermediate_size=48, num_hidden_layers=num_hidden_layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         tie_word_embeddings=False, rope_theta=500.0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    return str(folder)
