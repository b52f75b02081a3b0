"""--attention-dropout / --hidden-dropout: the model's own config fields set to the flags' values on the torch
backend (a nonzero one changes the training forward, 0 is today's), refused where it would be ignored; the megatron
backend's are tests/fast/megatron/test_megatron_dropout.py."""

from pathlib import Path

import pytest
import torch

from miles.config.arguments import parse_args
from miles.models.hf import dropout_overrides, load_causal_lm
from miles.ray.preflight import check_dropout
from miles.utils.errors import MilesConfigError

TOKENS = torch.tensor([[1, 5, 13, 6, 14, 3, 4, 2]])  # <bos> 2 + 3 = 0 1 <eos>, in the embedded vocabulary


def _train_logits(model):
    model.train()
    with torch.no_grad():
        return model(input_ids=TOKENS).logits


def test_the_fields_the_model_has_get_the_values():
    assert dropout_overrides({"attention_dropout": 0.0}, 0.25, 0.0) == {"attention_dropout": 0.25}
    assert dropout_overrides({"attn_pdrop": 0.1, "resid_pdrop": 0.1}, 0.0, 0.5) == {"attn_pdrop": 0.0,
                                                                                      "resid_pdrop": 0.5}
    with pytest.raises(MilesConfigError, match=r"--hidden-dropout 0.1: the checkpoint's model \(qwen2\) has no such"):
        dropout_overrides({"model_type": "qwen2", "attention_dropout": 0.0}, 0.0, 0.1)


def test_zero_is_todays_forward_and_a_nonzero_attention_dropout_changes_it(embedded):
    today = _train_logits(load_causal_lm(embedded.checkpoint_dir))
    zero = load_causal_lm(embedded.checkpoint_dir, attention_dropout=0.0, hidden_dropout=0.0)
    assert torch.equal(_train_logits(zero), today)
    dropped = load_causal_lm(embedded.checkpoint_dir, attention_dropout=0.5)
    assert dropped.config.attention_dropout == 0.5
    torch.manual_seed(0)
    first = _train_logits(dropped)
    assert not torch.allclose(first, today, atol=1e-3)  # dropout of half the attention weights moves the logits
    dropped.eval()
    with torch.no_grad():
        assert torch.equal(dropped(input_ids=TOKENS).logits, today)  # the log-prob passes run without dropout


def test_the_preflight_refuses_what_would_be_ignored(embedded):
    folder = Path(embedded.checkpoint_dir)
    check_dropout(parse_args(argv=["--train-backend", "torch", "--attention-dropout", "0.1"]), folder)
    with pytest.raises(MilesConfigError, match="has no such dropout"):
        check_dropout(parse_args(argv=["--train-backend", "torch", "--hidden-dropout", "0.1"]), folder)
    # megatron's GPTModel has both dropouts, whatever the checkpoint's config.json names (tests/fast/megatron)
    check_dropout(parse_args(argv=["--train-backend", "megatron", "--attention-dropout", "0.1",
                                   "--hidden-dropout", "0.1"]), folder)
