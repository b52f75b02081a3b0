"""The process's parallel layout (parallel.py) and the context-parallel slicing (cp_utils.py) at upstream's paths."""

import pytest
import torch

from miles.backends.training_utils import cp_utils, parallel
from miles.backends.training_utils.parallel import GroupInfo, ParallelState


def test_an_unset_parallel_state_is_an_error_that_names_the_fix(monkeypatch):
    monkeypatch.setattr(parallel, "_parallel_state", None)
    with pytest.raises(RuntimeError, match="set_parallel_state"):
        parallel.get_parallel_state()


def test_a_process_outside_a_group_is_one_rank_in_every_group():
    state = parallel.process_parallel_state(tensor_parallel_size=1)
    assert state == ParallelState(*[GroupInfo(rank=0, size=1, group=None)] * 8)


def test_upstreams_keyword_construction_is_accepted_and_set_for_the_process(monkeypatch):
    monkeypatch.setattr(parallel, "_parallel_state", None)
    group = GroupInfo(rank=1, size=2, group=None)
    one = GroupInfo(rank=0, size=1, group=None)
    state = ParallelState(intra_dp=group, intra_dp_cp=group, cp=one, tp=one, pp=one, ep=one, etp=one, indep_dp=one)
    parallel.set_parallel_state(state)
    assert parallel.get_parallel_state().intra_dp.size == 2


@pytest.mark.parametrize("qkv_format", ["thd", "bshd"])
def test_with_one_context_parallel_rank_gather_and_slice_return_the_whole_response(qkv_format):
    log_probs = torch.tensor([-0.5, -1.0, -0.25], requires_grad=True)
    gathered = cp_utils.all_gather_with_cp(log_probs, 7, 3, qkv_format, 16 if qkv_format == "bshd" else None)
    assert gathered is log_probs  # no copy: the gradient flows as it did
    assert cp_utils.slice_log_prob_with_cp([0.1, 0.2, 0.3], 7, 3, qkv_format) == [0.1, 0.2, 0.3]


def test_a_larger_context_parallel_group_a_wrong_length_and_an_unknown_layout_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="response_length is 4"):
        cp_utils.all_gather_with_cp(torch.zeros(3), 7, 4)
    with pytest.raises(ValueError, match="qkv_format"):
        cp_utils.slice_log_prob_with_cp(torch.zeros(3), 7, 3, "sbhd")
    one, two = GroupInfo(0, 1), GroupInfo(0, 2)
    monkeypatch.setattr(parallel, "_parallel_state", ParallelState(one, two, two, one, one, one, one, one))
    with pytest.raises(NotImplementedError, match="context-parallel group has 2 ranks"):
        cp_utils.all_gather_with_cp(torch.zeros(3), 7, 3)
