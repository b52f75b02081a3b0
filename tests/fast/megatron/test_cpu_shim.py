"""The CPU shim: each override is pinned to the megatron-core function it replaces, computes what that function
computes (run here with the CUDA device call redirected to the CPU), and is installed only without CUDA."""

import pytest
import torch

from tests.extras import MEGATRON_ABSENT, megatron_installed

if not megatron_installed():  # by the distribution: with the extra installed, the imports below must work
    pytest.skip(MEGATRON_ABSENT, allow_module_level=True)
pytestmark = pytest.mark.megatron

from megatron.core import utils as megatron_utils  # noqa: E402
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding  # noqa: E402
from megatron.core.tensor_parallel import random as megatron_random  # noqa: E402

from miles.backends.megatron_backend import cpu_shim  # noqa: E402


@pytest.mark.parametrize("name", sorted(cpu_shim.PINNED_SOURCE_SHA256))
def test_the_replaced_function_is_the_pinned_one(name):
    """Fails when a megatron-core upgrade changes the function: re-read it, adapt the override, update the pin."""
    assert cpu_shim.source_sha256(cpu_shim.ORIGINALS[name]) == cpu_shim.PINNED_SOURCE_SHA256[name], (
        f"megatron-core's {name} changed; the CPU shim's override of it must be re-checked"
    )


@pytest.fixture
def cuda_device_is_the_cpu(monkeypatch):
    """Lets the original functions run here: their ``torch.cuda.current_device()`` answers "cpu" (test only)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")


@pytest.mark.usefixtures("cuda_device_is_the_cpu")
@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_override_computes_what_the_original_computes(interleaved):
    rotary = RotaryEmbedding(kv_channels=8, rotary_percent=1.0, rotary_interleaved=interleaved, rotary_base=500,
                             use_cpu_initialization=True)
    expected = cpu_shim.ORIGINALS["RotaryEmbedding.get_emb"](rotary, 7, offset=2)
    actual = cpu_shim._rotary_get_emb_on_cpu(rotary, 7, offset=2)
    assert actual.shape == (7, 1, 1, 8)
    assert torch.equal(actual, expected)


@pytest.mark.usefixtures("cuda_device_is_the_cpu")
def test_memory_buffer_override_allocates_and_reuses_like_the_original():
    original, override = megatron_utils.GlobalMemoryBuffer(), megatron_utils.GlobalMemoryBuffer()
    for shape in [(2, 3), (4, 5), (1, 2)]:  # grows once, then reuses the larger buffer for the smaller request
        expected = cpu_shim.ORIGINALS["GlobalMemoryBuffer.get_tensor"](original, shape, torch.float32, "attn")
        actual = cpu_shim._memory_buffer_get_tensor_on_cpu(override, shape, torch.float32, "attn")
        assert (actual.shape, actual.dtype, actual.device) == (expected.shape, expected.dtype, expected.device)
    assert [buffer.numel() for buffer in override.buffer.values()] == [20]
    assert [buffer.numel() for buffer in original.buffer.values()] == [20]


def test_the_shim_is_installed_without_cuda_and_left_out_with_it(monkeypatch):
    monkeypatch.setattr(RotaryEmbedding, "get_emb", cpu_shim.ORIGINALS["RotaryEmbedding.get_emb"])
    monkeypatch.setattr(megatron_utils.GlobalMemoryBuffer, "get_tensor",
                        cpu_shim.ORIGINALS["GlobalMemoryBuffer.get_tensor"])
    for name in ("_get_cuda_rng_state", "_set_cuda_rng_state"):
        monkeypatch.setattr(megatron_random, name, cpu_shim.ORIGINALS[name])
    monkeypatch.setattr(megatron_random, "_CUDA_RNG_STATE_TRACKER", None)
    monkeypatch.setattr(megatron_random, "_CUDA_RNG_STATE_TRACKER_INITIALIZED", False)
    for module in (cpu_shim.megatron_mappings, cpu_shim.megatron_layers):
        monkeypatch.setattr(module, "torch", torch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cpu_shim.apply_cpu_shim() is False
    assert RotaryEmbedding.get_emb is cpu_shim.ORIGINALS["RotaryEmbedding.get_emb"]
    assert cpu_shim.megatron_mappings.torch is cpu_shim.megatron_layers.torch is torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cpu_shim.apply_cpu_shim() is True
    assert RotaryEmbedding.get_emb is cpu_shim._rotary_get_emb_on_cpu
    assert megatron_utils.GlobalMemoryBuffer.get_tensor is cpu_shim._memory_buffer_get_tensor_on_cpu
    assert megatron_random._get_cuda_rng_state is megatron_random._set_cuda_rng_state is cpu_shim._no_device_rng_state
    assert type(megatron_random.get_cuda_rng_tracker()) is cpu_shim.CpuRNGStatesTracker
    for module in (cpu_shim.megatron_mappings, cpu_shim.megatron_layers):
        assert isinstance(module.torch, cpu_shim._TorchWithCpuDevice)


def test_the_sequence_parallel_modules_see_torch_with_the_cpu_as_the_current_device():
    """Only ``torch.cuda.current_device()`` differs; everything else is torch's own object (not a copy)."""
    view = cpu_shim._TorchWithCpuDevice()
    assert view.cuda.current_device() == torch.device("cpu")
    assert view.empty is torch.empty and view.Tensor is torch.Tensor and view.distributed is torch.distributed
    assert view.cuda.is_available is torch.cuda.is_available and view.cuda.Stream is torch.cuda.Stream
    assert view.empty(3, device=view.cuda.current_device()).device == torch.device("cpu")
    with pytest.raises((AssertionError, RuntimeError)):  # torch.cuda itself still fails where CUDA is needed
        torch.cuda.current_device()


@pytest.fixture
def cpu_tracker():
    """A fresh CPU tracker seeded by megatron's own function, as ``initialize_model_parallel`` seeds it."""
    cpu_shim.apply_cpu_shim()
    tracker = megatron_random.get_cuda_rng_tracker()
    megatron_random.model_parallel_cuda_manual_seed(5, tp_rank=1, ep_rank=0, etp_rank=0)
    return tracker


def test_megatron_seeds_the_cpu_tracker_with_its_per_rank_seeds(cpu_tracker):
    """model_parallel_cuda_manual_seed(5) at tensor-parallel rank 1: the model-parallel state is seed + 2718 + 1,
    the data-parallel one the seed itself (megatron's offsets); each is the CPU generator seeded so."""
    outer = torch.get_rng_state()
    for name, seed in ((megatron_random._MODEL_PARALLEL_RNG_TRACKER_NAME, 5 + 2718 + 1),
                       (megatron_random._DATA_PARALLEL_RNG_TRACKER_NAME, 5)):
        with cpu_tracker.fork(name):
            drawn = torch.rand(4)
        assert torch.equal(drawn, torch.rand(4, generator=torch.Generator().manual_seed(seed)))
    assert torch.equal(torch.get_rng_state(), outer)  # the default stream is untouched by the forks


def test_a_fork_continues_its_stream_and_restores_the_outer_one(cpu_tracker):
    expected = torch.rand(6, generator=torch.Generator().manual_seed(5 + 2718 + 1))
    torch.manual_seed(0)
    outer_draws = torch.rand(2)
    torch.manual_seed(0)
    with cpu_tracker.fork():
        first = torch.rand(3)
        with cpu_tracker.fork(megatron_random._DATA_PARALLEL_RNG_TRACKER_NAME):
            torch.rand(5)  # a nested fork draws from its own state and leaves this one where it was
        second = torch.rand(3)
    assert torch.equal(torch.cat([first, second]), expected)
    assert torch.equal(torch.rand(2), outer_draws)


def test_recompute_replays_the_forked_draws(cpu_tracker):
    """megatron's CheckpointFunction saves and restores every RNG state around the replay: the dropout mask drawn
    under the tracker in the backward pass's recompute is the forward's (the gradient of x * mask is the mask)."""
    masks = []

    def dropped(x):
        with cpu_tracker.fork():
            mask = (torch.rand(x.shape) > 0.5).float()
        masks.append(mask)
        return x * mask

    x = torch.ones(64, requires_grad=True)
    megatron_random.checkpoint(dropped, False, x).sum().backward()
    assert len(masks) == 2 and torch.equal(masks[0], masks[1]) and torch.equal(x.grad, masks[0])
    assert 0 < masks[0].sum() < 64
