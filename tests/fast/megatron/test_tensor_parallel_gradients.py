"""The megatron backend's gradients at --tensor-model-parallel-size 2 (two spawned gloo processes), without and with
--sequence-parallel, and with sequence parallelism and full activation recompute (upstream's launchers pass TP, SP and
--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 together), against the torch
backend's (transformers' own model, one process, no recompute) on the same weights and loss: every tensor, gathered
to the HF layout, and the clip's global norm.

The replicated weights that each rank applies to only part of the work are the case that needs it: Qwen3's q/k
RMSNorm weights (each rank normalizes its own heads) and, under sequence parallelism, every norm outside attention
(each rank normalizes its slice of the sequence). Each rank's gradient of them is a partial sum that the ranks must
add up (megatron's finalize_model_grads does the same); a weight summed twice would be off by its own size. The
samples' lengths are odd, so sequence parallelism pads the batch to a multiple of 2.

Tolerance: as tests/fast/megatron/test_megatron_model.py (float32 over 2 layers, 1e-5 of the gradient's norm); the
all-reduces add one more float32 sum of 2 terms. A q/k norm gradient left partial is off by about half its size.
"""

import itertools
import multiprocessing
import queue
import socket

import pytest
import torch
import torch.distributed as dist

from tests.extras import MEGATRON_ABSENT, megatron_installed

if not megatron_installed():
    pytest.skip(MEGATRON_ABSENT, allow_module_level=True)
pytestmark = [pytest.mark.megatron, pytest.mark.usefixtures("restore_torch_threads")]

from miles.backends import load_train_model  # noqa: E402
from miles.backends.training_utils.recompute import Recompute  # noqa: E402
from tests.fast.backends.test_recompute import forward_calls  # noqa: E402
from tests.fast.megatron.test_megatron_model import SAMPLES  # noqa: E402

TENSOR_PARALLEL = 2
VARIANTS = {  # load_train_model's keywords beside the tensor-parallel size
    "tp": {},
    "tp+sp": {"sequence_parallel": True},
    "tp+sp+recompute": {"sequence_parallel": True, "recompute": Recompute("full", "uniform", 1)},
}
CASES = [*itertools.product(("qwen2", "qwen3"), ("actor", "critic"), ("tp", "tp+sp")),
         ("qwen2", "actor", "tp+sp+recompute"), ("qwen3", "critic", "tp+sp+recompute")]
SEEDS = {"actor": 0, "critic": 7}  # the seed initializes a new critic head, alike on both backends


def _gradients(model, role: str) -> tuple[dict[str, torch.Tensor], float]:
    """A loss with a different weight per response token (so every position matters) on the actor's log-probs or
    the critic's values, its backward, and the clip's norm (max_norm inf: nothing is scaled); the gradients named
    and laid out as the HF model's parameters."""
    rows = model.response_log_probs(SAMPLES, 1.0)[0] if role == "actor" else model.response_values(SAMPLES)
    loss = sum((row * torch.arange(1.0, len(row) + 1)).sum() for row in rows)
    loss.backward()
    norm = model.clip_grad_norm(float("inf"))
    grads = {name: param.grad for name, param in model.module.named_parameters()}
    return (model.hf_state_dict(grads) if hasattr(model, "layout") else grads), norm


def _rank(rank: int, port: int, checkpoints: dict[str, str], folder: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=TENSOR_PARALLEL)
    try:
        norms = {}
        for family, role, variant in CASES:
            model = load_train_model("megatron", role, checkpoints[family], seed=SEEDS[role],
                                     tensor_parallel_size=TENSOR_PARALLEL, **VARIANTS[variant])
            runs = forward_calls(model, "attention")
            grads, norms[family, role, variant] = _gradients(model, role)
            # recompute is really on: each layer's attention runs again in the backward pass (else the match is moot)
            assert set(runs) == {2 if "recompute" in VARIANTS[variant] else 1}, (variant, runs)
            if rank == 0:  # a file, not the queue: tensors on a queue need the exiting process's shared memory
                torch.save(grads, f"{folder}/{family}-{role}-{variant}.pt")
        results.put((rank, norms))
        dist.barrier()  # both ranks are done before either tears gloo down (see tests/fast/ranks)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def tensor_parallel_run(embedded, qwen3_checkpoint, tmp_path_factory) -> tuple[dict[str, str], str, dict]:
    checkpoints = {"qwen2": embedded.checkpoint_dir, "qwen3": qwen3_checkpoint}
    folder = str(tmp_path_factory.mktemp("tp-grads"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("spawn")  # a fresh process: the test process may hold a process group
    results = context.Queue()
    processes = [context.Process(target=_rank, args=(rank, port, checkpoints, folder, results))
                 for rank in range(TENSOR_PARALLEL)]
    for process in processes:
        process.start()
    outcomes = {}
    while len(outcomes) < len(processes):  # a rank that dies fails the test at once, not after a queue timeout
        try:
            rank, norms = results.get(timeout=1)
            outcomes[rank] = norms
        except queue.Empty:
            assert all(p.exitcode in (None, 0) for p in processes), [p.exitcode for p in processes]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    return checkpoints, folder, outcomes


@pytest.mark.parametrize(("family", "role", "variant"), CASES, ids=["-".join(case) for case in CASES])
def test_tensor_parallel_gradients_are_the_single_process_ones(tensor_parallel_run, family, role, variant):
    checkpoints, folder, norms = tensor_parallel_run
    expected, expected_norm = _gradients(load_train_model("torch", role, checkpoints[family], seed=SEEDS[role]), role)
    actual = torch.load(f"{folder}/{family}-{role}-{variant}.pt")
    assert set(expected) <= set(actual)  # a tied model's HF state also lists lm_head.weight
    for name, grad in expected.items():
        assert float((actual[name] - grad).abs().max()) <= 1e-5 * expected_norm, name
    for rank in range(TENSOR_PARALLEL):  # every rank's clip sees the whole model's norm
        assert abs(norms[rank][family, role, variant] - expected_norm) <= 1e-5 * expected_norm
