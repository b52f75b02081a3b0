"""Sharding a whole converted state over tensor-parallel ranks and gathering it back: exact, with fc1 split as
[gate_r; up_r] per rank and the vocabulary padded to a multiple of the tensor-parallel size."""

import pytest
import torch

from miles.backends.megatron_backend.tensor_parallel import (
    padded_vocab_size,
    shard_state,
    shard_tensor,
    unshard_tensor,
)

VOCAB = 15


def unshard_state(shards, dims, vocab_size):
    """The whole state from every rank's shards, in one process (the run gathers them with ``gather_state``)."""
    return {name: unshard_tensor(name, [shard[name] for shard in shards], dims[name], vocab_size) if name in dims
            else value for name, value in shards[0].items()}


def _whole() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "embedding.word_embeddings.weight": torch.randn(VOCAB, 4, generator=generator),
        "output_layer.weight": torch.randn(VOCAB, 4, generator=generator),
        "decoder.layers.0.self_attention.linear_qkv.weight": torch.randn(12, 4, generator=generator),
        "decoder.layers.0.self_attention.linear_proj.weight": torch.randn(4, 8, generator=generator),
        "decoder.layers.0.mlp.linear_fc1.weight": torch.randn(8, 4, generator=generator),
        "decoder.final_layernorm.weight": torch.randn(4, generator=generator),
    }


DIMS = {"embedding.word_embeddings.weight": 0, "output_layer.weight": 0,
        "decoder.layers.0.self_attention.linear_qkv.weight": 0, "decoder.layers.0.self_attention.linear_proj.weight": 1,
        "decoder.layers.0.mlp.linear_fc1.weight": 0}


@pytest.mark.parametrize("size", [1, 2, 4])
def test_shard_then_unshard_is_exact(size):
    whole = _whole()
    shards = [shard_state(whole, DIMS, rank, size, VOCAB) for rank in range(size)]
    back = unshard_state(shards, DIMS, VOCAB)
    assert back.keys() == whole.keys()
    for name, tensor in whole.items():
        assert torch.equal(back[name], tensor), name


def test_fc1_is_split_per_rank_into_its_gate_and_up_halves():
    """Megatron's SwiGLU chunks each rank's fc1 output in two: rank r must hold [gate_r; up_r]."""
    gate, up = torch.arange(4.0).reshape(4, 1) + 100, torch.arange(4.0).reshape(4, 1) + 200
    fc1 = torch.cat([gate, up])  # the whole layout qwen2.py converts to
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    assert shard_tensor(name, fc1, 0, 0, 2, VOCAB).flatten().tolist() == [100, 101, 200, 201]
    assert shard_tensor(name, fc1, 0, 1, 2, VOCAB).flatten().tolist() == [102, 103, 202, 203]


def test_the_vocabulary_is_padded_with_zero_rows_and_the_padding_is_stripped():
    assert [padded_vocab_size(VOCAB, size) for size in (1, 2, 4)] == [15, 16, 16]
    whole = _whole()["embedding.word_embeddings.weight"]
    shards = [shard_tensor("embedding.word_embeddings.weight", whole, 0, rank, 2, VOCAB) for rank in range(2)]
    assert [shard.shape[0] for shard in shards] == [8, 8]
    assert torch.equal(shards[1][-1], torch.zeros(4))  # the padded 16th row
    assert torch.equal(shards[0], whole[:8]) and torch.equal(shards[1][:7], whole[8:])


def test_replicated_tensors_are_the_same_tensor_on_every_rank():
    whole = _whole()
    shards = [shard_state(whole, DIMS, rank, 2, VOCAB) for rank in range(2)]
    assert all(shard["decoder.final_layernorm.weight"] is whole["decoder.final_layernorm.weight"] for shard in shards)
