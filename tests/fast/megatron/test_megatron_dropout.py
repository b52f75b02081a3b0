"""--attention-dropout / --hidden-dropout on the megatron backend (TransformerConfig's fields, seeded by the RNG
tracker, the CPU shim's without CUDA): 0 is today's forward, a nonzero one changes the training forward and not
the eval-mode one (the log-prob passes)."""

import pytest
import torch

from tests.extras import MEGATRON_ABSENT, megatron_installed

if not megatron_installed():
    pytest.skip(MEGATRON_ABSENT, allow_module_level=True)
pytestmark = pytest.mark.megatron

from miles.backends import load_train_model  # noqa: E402
from miles.utils.types import Sample  # noqa: E402

SAMPLES = [Sample(group_index=0, index=0, prompt="", label="", tokens=[1, 5, 13, 6, 14, 3, 4, 2], response_length=3)]


def _log_probs(model, train: bool) -> torch.Tensor:
    model.module.train(train)
    torch.manual_seed(0)
    with torch.no_grad():
        return model.response_log_probs(SAMPLES, 1.0)[0][0]


@pytest.mark.parametrize("dropout", [{"attention_dropout": 0.5}, {"hidden_dropout": 0.5}], ids=["attention", "hidden"])
def test_zero_is_todays_forward_and_a_nonzero_dropout_changes_only_the_training_one(embedded, dropout):
    today = _log_probs(load_train_model("megatron", "actor", embedded.checkpoint_dir, seed=0), train=True)
    zero = load_train_model("megatron", "actor", embedded.checkpoint_dir, seed=0,
                            dropout={"attention_dropout": 0.0, "hidden_dropout": 0.0})
    assert torch.equal(_log_probs(zero, train=True), today)
    dropped = load_train_model("megatron", "actor", embedded.checkpoint_dir, seed=0, dropout=dropout)
    config = dropped.module.config
    assert (config.attention_dropout, config.hidden_dropout) == (dropout.get("attention_dropout", 0.0),
                                                                 dropout.get("hidden_dropout", 0.0))
    # dropping half of the attention weights or hidden units moves the log-probs by far more than float rounding
    assert not torch.allclose(_log_probs(dropped, train=True), today, atol=1e-3)
    assert torch.equal(_log_probs(dropped, train=False), today)
