"""Context-parallel slicing of a sample's response tensors, at upstream's path and with upstream's signatures.

Upstream splits each packed sequence over the context-parallel (CP) ranks in a zigzag: ``all_gather_with_cp``
rebuilds a sample's whole response tensor from this rank's slice, ``slice_log_prob_with_cp`` cuts this rank's slice
out of a whole one. miles runs context parallelism of size 1 (``parallel.ParallelState.cp``), where this rank's
slice is the whole response in either layout (``qkv_format`` "thd", packed, or "bshd", padded), so both return their
input; a larger CP group is refused, since miles never builds one. miles' own GAE (``math_utils``) goes through
them exactly where upstream's does, and upstream's TIS hooks (e.g. ``compute_mis_weights_with_cp``) import them.
"""

from __future__ import annotations

import torch

from miles.backends.training_utils.parallel import get_parallel_state

QKV_FORMATS = ("thd", "bshd")


def _check_single_cp_rank(response_length: int, tensor_length: int, qkv_format: str) -> None:
    cp_size = get_parallel_state().cp.size
    if cp_size != 1:
        raise NotImplementedError(
            f"the context-parallel group has {cp_size} ranks, but miles implements context parallelism of size 1 "
            "only; run without context parallelism."
        )
    if qkv_format not in QKV_FORMATS:
        raise ValueError(f"qkv_format is {qkv_format!r}, but it must be one of {', '.join(QKV_FORMATS)}.")
    if tensor_length != response_length:
        raise ValueError(
            f"a response tensor has {tensor_length} entries, but its response_length is {response_length}: with one "
            "context-parallel rank a sample's tensor covers its whole response."
        )


def all_gather_with_cp(
    tensor: torch.Tensor,
    total_length: int,
    response_length: int,
    qkv_format: str = "thd",
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """The sample's whole response tensor (first dimension ``response_length``) from this CP rank's slice.

    ``total_length`` is prompt + response; ``max_seq_len`` the padded length under "bshd". With one CP rank the
    slice is the whole response: returned as is (gradients flow through)."""
    _check_single_cp_rank(response_length, len(tensor), qkv_format)
    return tensor


def slice_log_prob_with_cp(
    log_prob: list[float] | torch.Tensor,
    total_length: int,
    response_length: int,
    qkv_format: str = "thd",
    max_token_len: int | None = None,
) -> list[float] | torch.Tensor:
    """This CP rank's slice of a whole response tensor or list (length ``response_length``); with one CP rank, the
    whole of it, returned as is."""
    _check_single_cp_rank(response_length, len(log_prob), qkv_format)
    return log_prob
