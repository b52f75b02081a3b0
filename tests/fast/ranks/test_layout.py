"""The rank flags' rules, checked by the real parser: each refusal names the value, the rule and the fix."""

import pytest
import torch

from miles.backends.training_utils.optimizer_steps import run_optimizer_steps
from miles.config.rank_layout import RoleLayout, train_layouts
from miles.ranks.data_parallel import DataParallelRank
from miles.utils.arguments import parse_args
from miles.utils.errors import MilesConfigError

SMALL = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4"]  # 16 samples, one step


def test_defaults_are_one_rank_and_the_critic_follows_the_actor():
    args = parse_args(argv=[*SMALL, "--advantage-estimator", "ppo", "--actor-num-gpus-per-node", "2",
                            "--micro-batch-size", "8"])
    assert [(layout.role, layout.world_size, layout.data_parallel_size) for layout in train_layouts(args)] == [
        ("actor", 2, 2), ("critic", 2, 2)]
    assert any("critic_num_gpus_per_node" in line for line in args.derived)
    assert train_layouts(parse_args(argv=SMALL)) == [RoleLayout("actor", 1, 1, 1)]


def test_ranks_map_to_one_bundle_per_node():
    layout = RoleLayout("actor", num_nodes=2, ranks_per_node=3, tensor_parallel_size=2)
    assert (layout.world_size, layout.data_parallel_size) == (6, 3)
    assert [layout.bundle_of(rank) for rank in range(6)] == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--actor-num-gpus-per-node", "0"], "--actor-num-gpus-per-node is 0, but it must be >= 1"),
        (["--pipeline-model-parallel-size", "2"], "pipeline parallelism is not implemented"),
        (["--train-backend", "torch", "--tensor-model-parallel-size", "2", "--actor-num-gpus-per-node", "2"],
         "Add --train-backend megatron"),
        (["--train-backend", "megatron", "--tensor-model-parallel-size", "2", "--actor-num-gpus-per-node", "3"],
         "= 3 rank\\(s\\), which --tensor-model-parallel-size 2 does not divide"),
        (["--actor-num-gpus-per-node", "2", "--micro-batch-size", "3"],
         "--global-batch-size 16 is not divisible by the data-parallel size 2 .* Pass --micro-batch-size 2\\."),
        (["--actor-num-gpus-per-node", "3", "--micro-batch-size", "1"], "a multiple of 3 samples per step"),
        (["--advantage-estimator", "ppo", "--critic-num-nodes", "2", "--critic-num-gpus-per-node", "3",
          "--micro-batch-size", "1"], "the critic has --critic-num-nodes 2 x --critic-num-gpus-per-node 3"),
    ],
)
def test_a_layout_that_cannot_work_is_refused(argv, message):
    with pytest.raises(MilesConfigError, match=message):
        parse_args(argv=[*SMALL, *argv])


class _OneRanksView(DataParallelRank):
    """Rank ``rank`` of ``size`` taking its slice of each step; the group's reductions are left out (nothing to
    sum with: this test looks at which samples the rank's passes take)."""

    def reduce_gradients(self, parameters) -> None:
        pass

    def sum_totals(self, totals: dict[str, float]) -> dict[str, float]:
        return totals


def _passes(args, rank: int) -> list[list[int]]:
    """The micro-batches (sample indices) rank ``rank`` of the args' actor layout runs over one rollout of
    ``--rollout-batch-size x --n-samples-per-prompt`` samples, from the real step loop."""
    (layout, *_) = train_layouts(args)
    weight = torch.nn.Parameter(torch.zeros(1))
    passes = []

    def micro_batch_loss(indices, divisor):
        passes.append(list(indices))
        return weight.sum() * 0.0, {}

    num_samples = args.rollout_batch_size * args.n_samples_per_prompt
    run_optimizer_steps(lambda max_norm: 0.0, torch.optim.SGD([weight], lr=0.0), [torch.ones(1)] * num_samples,
                        args.global_batch_size, args.micro_batch_size, False, 1.0, micro_batch_loss,
                        data_parallel=_OneRanksView(rank, layout.data_parallel_size, group=None))
    return passes


@pytest.mark.parametrize(
    ("argv", "passes_by_rank"),
    [
        ([], [[list(range(16))]]),  # one rank: --micro-batch-size 128 above the 16-sample step means one pass
        (["--actor-num-gpus-per-node", "2"], [[list(range(8))], [list(range(8, 16))]]),  # 8 samples per rank
        (["--actor-num-gpus-per-node", "2", "--micro-batch-size", "4"],
         [[[0, 1, 2, 3], [4, 5, 6, 7]], [[8, 9, 10, 11], [12, 13, 14, 15]]]),  # upstream's rule: it fits
        (["--colocate", "--actor-num-gpus-per-node", "2"], [[list(range(8))], [list(range(8, 16))]]),
        (["--train-backend", "megatron", "--tensor-model-parallel-size", "2", "--actor-num-gpus-per-node", "2"],
         [[list(range(16))]]),  # TP=2 x DP=1: the one data-parallel rank takes the whole step
    ],
    ids=["one-rank", "dp2", "dp2-micro4", "colocated-dp2", "tp2"],
)
def test_a_micro_batch_larger_than_a_ranks_share_is_one_pass_over_it(argv, passes_by_rank):
    """Upstream's rule where the micro-batch fits a rank's share; above it (miles' default 128 in an upstream
    launcher that relied on upstream's default 1), one pass over the share, as for one process: the layout is
    accepted and the real step loop runs each data-parallel rank's share in those passes."""
    args = parse_args(argv=[*SMALL, *argv])
    assert [_passes(args, rank) for rank in range(len(passes_by_rank))] == passes_by_rank
