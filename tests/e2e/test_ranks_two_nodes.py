"""A real two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: one raylet per node, each with its
own resources): a DP=2 actor with ``--actor-num-nodes 2`` puts its ranks on two different nodes and trains
through ``--ray-address``."""

import logging

import pytest
import ray
from ray.cluster_utils import Cluster

import train
from miles.tracking.metrics import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture
def two_node_cluster():
    """Three one-CPU nodes (the head and two workers) for the engine and the actor's two ranks; the test session's own
    Ray (if a test before started it) is shut down meanwhile and started again afterwards."""
    was_initialized = ray.is_initialized()
    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    yield cluster, {node.node_id for node in [cluster.head_node, *workers]}
    ray.shutdown()
    cluster.shutdown()
    if was_initialized:
        ray.init(num_cpus=6, include_dashboard=False, logging_level="WARNING", log_to_driver=False)


def test_a_data_parallel_actor_spans_two_nodes_and_trains_through_ray_address(make_args, two_node_cluster, caplog):
    cluster, node_ids_of_cluster = two_node_cluster
    args = make_args("--num-rollout", "2", "--actor-num-nodes", "2", "--micro-batch-size", "8",
                     "--ray-address", cluster.address)
    with caplog.at_level(logging.INFO, logger="miles"):
        train.train(args)
    placed = [record for record in caplog.records if record.getMessage().startswith("actor: 2 rank(s)")]
    assert len(placed) == 1
    node_ids = placed[0].args[-1]  # each rank's node, as Ray's runtime context reports it inside the rank
    assert len(set(node_ids)) == 2 and set(node_ids) <= node_ids_of_cluster
    assert [record["rollout_id"] for record in read_metrics(args.log_dir)] == [0, 1]
