"""What the megatron backend refuses at startup, from config.json alone (no megatron import, no Ray)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from miles.backends.megatron_backend.support import check_megatron_backend
from miles.utils.errors import MilesConfigError

QWEN2 = {"model_type": "qwen2", "hidden_act": "silu", "num_attention_heads": 4, "num_key_value_heads": 2,
         "attention_dropout": 0.0, "use_sliding_window": False, "rope_parameters": {"rope_type": "default"}}


def _checkpoint(tmp_path, **changes) -> str:
    (tmp_path / "config.json").write_text(json.dumps({**QWEN2, **changes}))
    return str(tmp_path)


def test_the_embedded_default_is_accepted(embedded):
    check_megatron_backend(embedded.checkpoint_dir)


def test_the_tiny_qwen3_is_accepted(qwen3_checkpoint):
    check_megatron_backend(qwen3_checkpoint, tensor_parallel_size=2)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_type": "llama"}, "model_type is 'llama', but the backend converts only qwen2, qwen3"),
        ({"model_type": "qwen3", "attention_bias": True}, "attention_bias is true"),
        ({"hidden_act": "gelu"}, "hidden_act is 'gelu'"),
        ({"use_sliding_window": True}, "no sliding-window attention"),
        ({"rope_parameters": {"rope_type": "yarn"}}, "RoPE type 'yarn' is not supported"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
    ],
    ids=["family", "qwen3-attention-bias", "activation", "sliding-window", "rope", "heads"],
)
def test_what_cannot_be_converted_is_refused_with_the_value_and_the_fix(tmp_path, changes, message):
    with pytest.raises(MilesConfigError, match=message) as caught:
        check_megatron_backend(_checkpoint(tmp_path, **changes))
    assert "--train-backend torch" in str(caught.value)


def test_the_checkpoints_attention_dropout_is_no_obstacle(tmp_path):
    """The backend's dropout is --attention-dropout's (TransformerConfig), not config.json's, on CPU too."""
    check_megatron_backend(_checkpoint(tmp_path, attention_dropout=0.1))


def test_a_missing_megatron_core_names_the_extra(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("megatron") else real_find_spec(name, *a))
    with pytest.raises(MilesConfigError, match=r"pip install -e '\.\[megatron\]'"):
        check_megatron_backend(_checkpoint(tmp_path))


def test_a_bare_launch_without_the_extra_fails_in_one_line_before_ray_starts(embedded, tmp_path):
    """The default backend is megatron: without megatron-core, a bare ``train_async.py`` names the extra and the
    torch backend in its one error line. A regular ``megatron`` package first on the path hides the installed
    namespace package's ``megatron.core``, as if the extra were not installed."""
    (tmp_path / "megatron").mkdir()
    (tmp_path / "megatron" / "__init__.py").write_text("")
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo)]),
           "MILES_CACHE_DIR": str(Path(embedded.checkpoint_dir).parents[1])}
    done = subprocess.run([sys.executable, "train_async.py", "--log-dir", str(tmp_path / "run")], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert "needs megatron-core, which is not installed" in errors[0]
    assert "pip install -e '.[megatron]'" in errors[0] and "--train-backend torch" in errors[0]
    assert "Ray" not in done.stdout + done.stderr  # refused in the preflight: no cluster was started
    assert not (tmp_path / "run").exists()


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
        check_megatron_backend(_checkpoint(tmp_path, **config), tensor_parallel_size=4)
    check_megatron_backend(_checkpoint(tmp_path, intermediate_size=32), tensor_parallel_size=2)
