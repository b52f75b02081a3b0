"""What the megatron backend refuses at startup, from config.json alone (no megatron import, no Ray)."""

import importlib.util
import json

import pytest

from miles.backends.megatron_backend.support import check_megatron_backend
from miles.utils.errors import MilesConfigError

QWEN2 = {"model_type": "qwen2", "hidden_act": "silu", "num_attention_heads": 4, "num_key_value_heads": 2,
         "attention_dropout": 0.0, "use_sliding_window": False, "rope_parameters": {"rope_type": "default"}}


def _checkpoint(tmp_path, **changes) -> str:
    (tmp_path / "config.json").write_text(json.dumps({**QWEN2, **changes}))
    return str(tmp_path)


def test_the_embedded_default_is_accepted(embedded):
    check_megatron_backend(embedded.checkpoint_dir, cuda_available=False)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_type": "llama"}, "model_type is 'llama', but the backend converts only qwen2"),
        ({"hidden_act": "gelu"}, "hidden_act is 'gelu'"),
        ({"use_sliding_window": True}, "no sliding-window attention"),
        ({"rope_parameters": {"rope_type": "yarn"}}, "RoPE type 'yarn' is not supported"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
        ({"attention_dropout": 0.1}, "attention_dropout is 0.1"),
    ],
    ids=["family", "activation", "sliding-window", "rope", "heads", "dropout"],
)
def test_what_cannot_be_converted_is_refused_with_the_value_and_the_fix(tmp_path, changes, message):
    with pytest.raises(MilesConfigError, match=message) as caught:
        check_megatron_backend(_checkpoint(tmp_path, **changes), cuda_available=False)
    assert "--train-backend torch" in str(caught.value)


def test_dropout_is_refused_only_without_cuda(tmp_path):
    check_megatron_backend(_checkpoint(tmp_path, attention_dropout=0.1), cuda_available=True)


def test_a_missing_megatron_core_names_the_extra(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("megatron") else real_find_spec(name, *a))
    with pytest.raises(MilesConfigError, match=r"pip install -e '\.\[megatron\]'"):
        check_megatron_backend(_checkpoint(tmp_path), cuda_available=False)



@pytest.mark.parametrize(
    ("changes", "name"),
    [({"num_attention_heads": 6, "num_key_value_heads": 6}, "num_attention_heads is 6"),
     ({"num_key_value_heads": 1}, "num_key_value_heads \\(query groups\\) is 1"),
     ({"num_key_value_heads": 4, "intermediate_size": 34}, "intermediate_size \\(FFN\\) is 34")],
    ids=["heads", "query-groups", "ffn"],
)
def test_a_tensor_parallel_size_that_does_not_split_the_model_is_refused(tmp_path, changes, name):
    config = {"intermediate_size": 32, **changes}
    with pytest.raises(MilesConfigError, match=f"{name}, which --tensor-model-parallel-size 4 does not divide"):
        check_megatron_backend(_checkpoint(tmp_path, **config), cuda_available=False, tensor_parallel_size=4)
    check_megatron_backend(_checkpoint(tmp_path, intermediate_size=32), cuda_available=False, tensor_parallel_size=2)
