"""The step loop on two data-parallel ranks (two spawned processes, gloo) takes the single-process step: same
parameters after two optimizer steps, same metrics, same gradient norm; with --balance-data too, because the step's
divisor (its loss-mask token total with --calculate-per-token-loss, else its sample count) is taken over the whole
step before it is shared, so the all-reduced gradient is the same sum over the same samples in another order."""

import multiprocessing
import socket

import pytest
import torch
import torch.distributed as dist

from miles.backends.training_utils.micro_batches import balanced_order
from miles.backends.training_utils.optimizer_steps import run_optimizer_steps
from miles.ranks.data_parallel import DataParallelRank, SingleRank

NUM_SAMPLES, GLOBAL_BATCH = 8, 4
# The ranks compute in float64: the test is about what data parallelism does (each rank's share, the gradient
# all-reduce, the metric totals), which does not depend on the dtype, and float64 makes its tolerance hold on any
# CPU. Two ranks add a step's GLOBAL_BATCH micro-batch gradients in another order than one process ((g0 + g1) +
# (g2 + g3) against ((g0 + g1) + g2) + g3): each sum differs by at most 2 (n - 1) u sum|g_i| (u = 2^-53, n = 4),
# a relative 7e-16 * kappa of the gradient (kappa = sum|g_i| / |sum g_i|, its condition number), and Adam's
# update m / (sqrt(v) + eps) a few times that. REL = 1e-9 allows kappa up to about 1e5 over the two steps; a rank
# that took the wrong share or skipped the all-reduce moves the parameters by about lr = 0.1.
DTYPE, REL = torch.float64, 1e-9
# tokens per sample, longest first within each step, so --balance-data moves samples between the ranks' shares
LENGTHS = [41, 37, 33, 26, 22, 18, 11, 7]


def _train(data_parallel, balance_data: bool = False) -> tuple[dict, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1, dtype=DTYPE)
    inputs, targets = torch.randn(NUM_SAMPLES, 3, dtype=DTYPE), torch.randn(NUM_SAMPLES, dtype=DTYPE)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    loss_masks = [torch.ones(1 + i % 3) for i in range(NUM_SAMPLES)]  # per-token divisors differ per step

    def micro_batch_loss(indices, divisor):
        errors = (model(inputs[indices]).squeeze(-1) - targets[indices]) ** 2
        per_sample = errors * torch.tensor([float(len(loss_masks[i])) for i in indices], dtype=DTYPE)
        return per_sample.sum() / divisor, {"loss": float(per_sample.detach().mean())}

    clip = lambda max_norm: float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))  # noqa: E731
    metrics = run_optimizer_steps(clip, optimizer, loss_masks, GLOBAL_BATCH, 1, True, 0.5, micro_batch_loss,
                                  data_parallel=data_parallel, lengths=LENGTHS, balance_data=balance_data)
    return metrics, [p.detach().clone() for p in model.parameters()]


def _rank(rank: int, port: int, results, balance_data: bool) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        data_parallel = DataParallelRank(rank, 2, dist.group.WORLD)
        metrics, params = _train(data_parallel, balance_data)
        merged = data_parallel.merged({rank: rank * 10})
        results.put((rank, metrics, [param.tolist() for param in params], merged))  # plain data: the process exits
        # Both ranks are done before either tears gloo down: a rank that destroys its group while the other still
        # talks to it can abort at exit ("terminate called without an active exception"), seen on a loaded machine.
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("balance_data", [False, True], ids=["contiguous", "balance-data"])
def test_two_data_parallel_ranks_take_the_single_process_steps(balance_data):
    expected_metrics, expected_params = _train(SingleRank())  # the reference never balances
    if balance_data:  # the shares do change: rank 0 takes samples 0 and 3 of the first step, not 0 and 1
        assert balanced_order(range(GLOBAL_BATCH), LENGTHS, 2) == [0, 3, 1, 2]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("spawn")  # a fresh process: the test process may hold a process group
    results = context.Queue()
    processes = [context.Process(target=_rank, args=(rank, port, results, balance_data)) for rank in range(2)]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    for rank, metrics, params, merged in outcomes:
        assert merged == {0: 0, 1: 10}
        assert metrics.keys() == expected_metrics.keys()
        for name, value in metrics.items():  # float64 sums in another order (REL: see above)
            assert value == pytest.approx(expected_metrics[name], rel=REL), (rank, name)
        for param, expected in zip(params, expected_params, strict=True):
            torch.testing.assert_close(torch.tensor(param, dtype=DTYPE), expected, rtol=REL, atol=REL * 0.1)


def test_each_rank_takes_a_contiguous_share_of_each_step():
    step = [8, 9, 10, 11, 12, 13]
    shares = [DataParallelRank(rank, 3, group=None).local_indices(step) for rank in range(3)]
    assert shares == [[8, 9], [10, 11], [12, 13]]
    assert SingleRank().local_indices(step) == step
    assert [DataParallelRank(rank, 3, None).writes_checkpoint for rank in range(3)] == [True, False, False]
