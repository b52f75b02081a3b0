"""A TIS hook written against upstream miles' hook contract, whole: upstream's keywords (``total_lengths``,
``response_lengths``, ``**kwargs`` with ``max_seq_lens``), the context-parallel gather and slice of
``miles.backends.training_utils.cp_utils``, ``args.qkv_format`` (--qkv-format) and settings read from a
--custom-config-path file (``cp_tis.yaml``), as upstream's ``compute_mis_weights_with_cp`` does. The same file runs
under upstream miles. miles' end-to-end tests train through it on both train backends.

    train_async.py --advantage-estimator ppo --use-tis --custom-config-path examples/tis_hook/cp_tis.yaml \
        --custom-tis-function-path examples.tis_hook.cp_tis.compute_tis_weights_with_cp

Per token, r = exp(clamp(train − rollout, −20, 20)) and w = min(r, tis_upper_bound) on the loss-mask tokens (0
elsewhere): miles' built-in ``--tis-mode truncate --tis-clip tis_upper_bound``. With ``tis_batch_normalize`` the
weights are divided by their mean over the micro-batch's loss-mask tokens (mean 1, upstream's MIS rule).
"""

from typing import Any

import torch

from miles.backends.training_utils.cp_utils import all_gather_with_cp, slice_log_prob_with_cp


def compute_tis_weights_with_cp(
    args,
    *,
    pg_loss: torch.Tensor,
    train_log_probs: list[torch.Tensor],
    rollout_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    total_lengths: list[int],
    response_lengths: list[int],
    **kwargs: Any,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    max_seq_lens = kwargs.get("max_seq_lens")
    layout = [(total, response, args.qkv_format, None if max_seq_lens is None else max_seq_lens[i])
              for i, (total, response) in enumerate(zip(total_lengths, response_lengths, strict=True))]
    train = [all_gather_with_cp(t, *where) for t, where in zip(train_log_probs, layout, strict=True)]
    rollout = [all_gather_with_cp(r, *where) for r, where in zip(rollout_log_probs, layout, strict=True)]
    ratios = [torch.exp(torch.clamp(t - r, -20.0, 20.0)) for t, r in zip(train, rollout, strict=True)]
    weights = [ratio.clamp(max=args.tis_upper_bound) * mask for ratio, mask in zip(ratios, loss_masks, strict=True)]
    if args.tis_batch_normalize:
        mean = sum(w.sum() for w in weights) / torch.clamp_min(sum(m.sum() for m in loss_masks), 1)
        weights = [w / mean for w in weights]

    def local(per_sample: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([slice_log_prob_with_cp(x, *where) for x, where in zip(per_sample, layout, strict=True)])

    metrics = {"cp_tis_weight": local(weights),
               "cp_tis_truncated": local([(ratio > args.tis_upper_bound).float() for ratio in ratios])}
    return pg_loss * local(weights).detach(), loss_masks, metrics
