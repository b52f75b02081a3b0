"""The rank flags' rules, checked by the real parser: each refusal names the value, the rule and the fix."""

import pytest

from miles.ranks.layout import RoleLayout, train_layouts
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
        (["--tensor-model-parallel-size", "2", "--actor-num-gpus-per-node", "2"], "Add --train-backend megatron"),
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


def test_a_micro_batch_larger_than_a_ranks_share_is_one_pass_over_it():
    """Upstream's rule where the micro-batch fits a rank's share; above it (miles' default 128 in an upstream
    launcher that relied on upstream's default 1), one pass, as for one process."""
    parse_args(argv=SMALL)  # one rank: --micro-batch-size 128 above the 16-sample step means one pass
    parse_args(argv=[*SMALL, "--actor-num-gpus-per-node", "2"])  # 8 samples per rank, one pass
    parse_args(argv=[*SMALL, "--actor-num-gpus-per-node", "2", "--micro-batch-size", "4"])
    parse_args(argv=[*SMALL, "--colocate", "--actor-num-gpus-per-node", "2"])  # engines share the actor's bundle
    parse_args(argv=[*SMALL, "--train-backend", "megatron", "--tensor-model-parallel-size", "2",
                     "--actor-num-gpus-per-node", "2"])  # TP=2 x DP=1
