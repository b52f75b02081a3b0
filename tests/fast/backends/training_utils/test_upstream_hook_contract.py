"""Upstream's TIS hook contract, whole: the keywords miles' loss passes, and miles' upstream-style example hook
(examples/tis_hook/cp_tis.py, cp_utils + args.qkv_format + --custom-config-path settings) against miles' built-in."""

import sys
import types

import pytest
import torch

from examples.tis_hook.cp_tis import compute_tis_weights_with_cp
from miles.backends.training_utils.loss import policy_loss
from miles.backends.training_utils.loss_hub import corrections
from miles.backends.training_utils.parallel import get_parallel_state
from tests.fast.backends.loss_configs import loss_config


def test_the_hook_receives_upstreams_full_keyword_set(tmp_path, monkeypatch):
    (tmp_path / "recording_tis.py").write_text(
        "seen = {}\n"
        "def record(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths,\n"
        "           response_lengths, **kwargs):\n"
        "    seen.update(kwargs, total_lengths=total_lengths, response_lengths=response_lengths)\n"
        "    return pg_loss, loss_masks, {}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    batch = {"loss_masks": [torch.ones(2), torch.ones(3)], "advantages": [torch.ones(2), torch.ones(3)],
             "old_log_probs": [torch.zeros(2), torch.zeros(3)], "rollout_log_probs": [torch.zeros(2), torch.zeros(3)],
             "total_lengths": [6, 9]}
    cfg = loss_config("--use-tis", "--custom-tis-function-path", "recording_tis.record")
    policy_loss(cfg, batch, [torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)], None, 2.0)
    seen = sys.modules.pop("recording_tis").seen
    assert seen["total_lengths"] == [6, 9] and seen["response_lengths"] == [2, 3]
    assert seen["max_seq_lens"] is None and seen["parallel_state"] is get_parallel_state()


def _hook_args(normalize: bool):
    return types.SimpleNamespace(qkv_format="thd", tis_upper_bound=1.2, tis_batch_normalize=normalize)


def _inputs(seed: int):
    generator = torch.Generator().manual_seed(seed)
    lengths = [3, 5, 1]
    train = [torch.randn(n, generator=generator) * 0.4 for n in lengths]
    rollout = [torch.randn(n, generator=generator) * 0.4 for n in lengths]
    masks = [torch.tensor([1.0, 0.0, 1.0]), torch.ones(5), torch.ones(1)]
    pg = torch.randn(sum(lengths), generator=generator)
    return dict(pg_loss=pg, train_log_probs=train, rollout_log_probs=rollout, loss_masks=masks,
                total_lengths=[n + 4 for n in lengths], response_lengths=lengths)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_example_hook_equals_the_builtin_truncate_on_the_loss_tokens(seed):
    kwargs = _inputs(seed)
    pg, masks, metrics = compute_tis_weights_with_cp(_hook_args(False), **kwargs)
    builtin = loss_config("--use-tis", "--tis-mode", "truncate", "--tis-clip", "1.2").hook_args
    expected, builtin_masks, _ = corrections.configured_tis_function(builtin, **kwargs)
    kept = torch.cat(kwargs["loss_masks"]) != 0  # the hook writes 0 off the mask, where the loss never looks
    torch.testing.assert_close(pg[kept], expected[kept], rtol=2**-22, atol=1e-7)
    assert [m.tolist() for m in masks] == [m.tolist() for m in builtin_masks]
    assert set(metrics) == {"cp_tis_weight", "cp_tis_truncated"}


def test_batch_normalization_read_from_the_config_makes_the_mean_weight_one():
    kwargs = _inputs(2)
    _, _, plain = compute_tis_weights_with_cp(_hook_args(False), **kwargs)
    _, _, normalized = compute_tis_weights_with_cp(_hook_args(True), **kwargs)
    kept = torch.cat(kwargs["loss_masks"]) != 0
    mean = plain["cp_tis_weight"][kept].mean()
    assert abs(mean.item() - 1.0) > 1e-3  # the normalization has something to do here
    torch.testing.assert_close(normalized["cp_tis_weight"][kept].mean(), torch.tensor(1.0))
    torch.testing.assert_close(normalized["cp_tis_weight"], plain["cp_tis_weight"] / mean)
