"""Activation recompute on both backends: the same loss and gradients as the step without it, dropout included
(the replay must draw the same masks), the layers it names really run twice, and the rules refuse in one line.

The reference is the unchanged code path: the same model loaded without the recompute flags, under the same seeds.
Tolerance: a recomputed layer repeats the same float32 operations on the same inputs, so its activations are
bit-identical; only the order in which the backward pass adds gradient contributions may change (the
checkpoint's inner backward), a few float32 roundings (eps 1.2e-7) per element of sums of a few dozen terms.
1e-6 of the gradient's largest element bounds that; a replayed dropout mask that differed (or no dropout at all
on one side) moves the gradients by whole percents.
"""

import pytest
import torch

from miles.backends import load_train_model
from miles.backends.training_utils.recompute import Recompute, checkpointed_layers, recompute_problem
from miles.config.arguments import parse_args
from miles.utils.types import Sample
from tests.extras import MEGATRON_ABSENT, megatron_installed
from tests.tiny_qwen2 import save_gqa_qwen2

SAMPLES = [Sample(group_index=i, index=i, prompt="", label="", tokens=prompt + response,
                  response_length=len(response))
           for i, (prompt, response) in enumerate([([1, 3, 12], [4, 2]), ([1, 5, 12, 5, 13], [2]),
                                                   ([1], [4, 5, 6, 7, 8, 2])])]
DROPOUT = {"attention_dropout": 0.3, "hidden_dropout": 0.0}
SEED = 11
BACKENDS = ["torch", pytest.param("megatron", marks=[
    pytest.mark.megatron, pytest.mark.skipif(not megatron_installed(), reason=MEGATRON_ABSENT)])]


@pytest.fixture(scope="module")
def three_layers(tmp_path_factory) -> str:
    """A random Qwen2 of 3 layers (so block 1 and uniform chunks of 2 leave layers out), GQA, untied embeddings."""
    return save_gqa_qwen2(tmp_path_factory.mktemp("three-layers"), num_hidden_layers=3)


def _reseed(backend: str) -> None:
    """The same random-number state before each compared step: torch's, and on megatron its RNG tracker's."""
    torch.manual_seed(SEED)
    if backend == "megatron":
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(SEED)


def forward_calls(model, part: str) -> list[int]:
    """Counts of the forward calls of each layer's ``part`` (inside every checkpoint on both backends)."""
    name = {"attention": "core_attention", "mlp": "mlp"}[part] if model.__class__.__name__ == "MegatronTrainModel" \
        else {"attention": "self_attn", "mlp": "mlp"}[part]
    counts = []
    for module_name, module in model.module.named_modules():
        if module_name.endswith(name):
            counts.append(0)
            module.register_forward_hook(lambda *_, i=len(counts) - 1: counts.__setitem__(i, counts[i] + 1))
    return counts


def _step(backend, folder, dropout, recompute=Recompute(), part="attention"):
    """One training forward and backward: loss = sum of the response log-probs weighted by position (so every
    token's gradient differs); returns the loss, the gradients by name and the calls of ``part`` per layer."""
    model = load_train_model(backend, "actor", folder, seed=0, dropout=dropout, recompute=recompute)
    calls = forward_calls(model, part)
    model.module.train()
    _reseed(backend)
    log_probs, _ = model.response_log_probs(SAMPLES, 1.0)
    loss = sum((lp * torch.arange(1, len(lp) + 1)).sum() for lp in log_probs)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.module.named_parameters() if p.grad is not None}
    return loss.detach(), grads, calls


def _assert_same_step(actual, expected) -> None:
    (loss, grads, _), (expected_loss, expected_grads, _) = actual, expected
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=0)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        scale = expected_grads[name].abs().max().item()
        torch.testing.assert_close(grad, expected_grads[name], rtol=0, atol=1e-6 * max(scale, 1e-12), msg=name)


FULL_CASES = [(Recompute("full", "uniform", 1), [2, 2, 2]), (Recompute("full", "block", 1), [2, 1, 1])]
MEGATRON_CASES = [(Recompute("full", "uniform", 3), "attention", [2, 2, 2]),
                  (Recompute("full", "block", 2), "mlp", [2, 2, 1]),
                  (Recompute("selective"), "attention", [2, 2, 2]),  # Megatron's default: core_attn
                  (Recompute("selective", modules=("mlp",)), "mlp", [2, 2, 2]),
                  (Recompute("selective", modules=("mlp",)), "attention", [1, 1, 1])]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dropout", [{}, DROPOUT], ids=["no-dropout", "dropout"])
@pytest.mark.parametrize(("recompute", "calls"), FULL_CASES, ids=["uniform-1", "block-1"])
def test_full_recompute_gives_the_same_loss_and_gradients(three_layers, backend, dropout, recompute, calls):
    plain = _step(backend, three_layers, dropout)
    assert plain[2] == [1, 1, 1]
    recomputed = _step(backend, three_layers, dropout, recompute)
    assert recomputed[2] == calls  # a recomputed layer's attention runs again in the backward pass
    _assert_same_step(recomputed, plain)


@pytest.mark.megatron
@pytest.mark.skipif(not megatron_installed(), reason=MEGATRON_ABSENT)
@pytest.mark.parametrize(("recompute", "part", "calls"), MEGATRON_CASES,
                         ids=["uniform-3", "block-2", "core-attn", "mlp", "mlp-keeps-attention"])
def test_megatron_recompute_with_dropout_gives_the_same_loss_and_gradients(three_layers, recompute, part, calls):
    dropout = {"attention_dropout": 0.3, "hidden_dropout": 0.2}  # GPTModel has both
    plain = _step("megatron", three_layers, dropout)
    recomputed = _step("megatron", three_layers, dropout, recompute, part)
    assert recomputed[2] == calls
    _assert_same_step(recomputed, plain)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_dropout_of_these_tests_is_real(three_layers, backend):
    """Without this, the parity with dropout would hold vacuously: the dropped step differs from the plain one."""
    plain, dropped = _step(backend, three_layers, {}), _step(backend, three_layers, DROPOUT)
    assert abs(dropped[0] - plain[0]) > 1e-3 * abs(plain[0])  # 1000 times the parity tests' tolerance


def test_the_torch_backend_checkpoints_the_layers_megatron_would():
    assert checkpointed_layers(Recompute(), 3) == [False] * 3
    assert checkpointed_layers(Recompute("full", "uniform", 1), 3) == [True] * 3
    assert checkpointed_layers(Recompute("full", "block", 2), 3) == [True, True, False]


def _problem(argv, backend="megatron", layers=3):
    return recompute_problem(Recompute.from_args(parse_args(argv=argv)), backend, layers)


@pytest.mark.parametrize(("argv", "backend", "message"), [
    (["--recompute-granularity", "full"], "megatron", "full needs --recompute-method"),
    (["--recompute-granularity", "full", "--recompute-method", "block"], "torch", "--recompute-num-layers"),
    (["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "4"],
     "megatron", "1 to the model's 3 layers"),
    (["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"],
     "megatron", "must divide the model's 3 layers"),
    (["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"],
     "torch", "pass --recompute-num-layers 1"),
    (["--recompute-granularity", "selective", "--recompute-num-layers", "1"], "megatron", "full only"),
    (["--recompute-granularity", "selective", "--recompute-modules", "moe"], "megatron", "core_attn and mlp here"),
    (["--recompute-granularity", "selective", "--recompute-modules", "layernorm"], "megatron", "Transformer Engine"),
    (["--recompute-granularity", "selective"], "torch", "whole decoder layers only"),
    (["--recompute-method", "uniform", "--recompute-num-layers", "1"], "megatron", "needs --recompute-granularity"),
    (["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
      "--recompute-modules", "mlp"], "megatron", "selective only"),
])
def test_what_megatron_rejects_or_would_ignore_is_refused_in_one_line(argv, backend, message):
    problem = _problem(argv, backend)
    assert problem is not None and message in problem and "\n" not in problem
    assert problem.startswith(" ".join(argv[:2]))  # names the values given


def test_what_megatron_accepts_is_accepted():
    assert _problem([]) is None
    assert _problem(["--recompute-granularity", "selective"]) is None
    assert _problem(["--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp"]) is None
    for method, layers in (("uniform", "1"), ("block", "3")):
        for backend in ("torch", "megatron"):
            argv = ["--recompute-granularity", "full", "--recompute-method", method, "--recompute-num-layers", layers]
            assert _problem(argv, backend) is None


def test_the_preflight_checks_against_the_checkpoints_layers(three_layers):
    from pathlib import Path

    from miles.ray.preflight import check_recompute
    from miles.utils.errors import MilesConfigError

    full = ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers"]
    check_recompute(parse_args(argv=[*full, "3"]), Path(three_layers))
    with pytest.raises(MilesConfigError, match="1 to the model's 3 layers"):
        check_recompute(parse_args(argv=[*full, "4"]), Path(three_layers))


@pytest.mark.usefixtures("restore_torch_threads")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_training_step_through_the_parser_takes_the_plain_steps_update(embedded, backend):
    """The flags reach the train process (Recompute.from_args): one rollout's optimizer steps with recompute and
    attention dropout move the weights as the plain steps do. SGD, so the update is lr * gradient and the weights
    differ by at most lr times the gradients' float difference (Adam's g / (|g| + eps) would amplify the noise of
    a gradient that is exactly 0, such as k_proj's bias)."""
    from tests.fast.trainers import engine_with, make_rollout, max_change, policy_trainer, train_on, weights

    flags = ["--train-backend", backend, "--optimizer", "sgd", "--attention-dropout", "0.2"]
    recompute = ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    trainers = {name: policy_trainer(embedded, *flags, *extra) for name, extra in (("plain", []),
                                                                                   ("recompute", recompute))}
    module = trainers["recompute"].model.module
    if backend == "megatron":
        assert module.config.recompute_granularity == "full"
    else:
        assert [layer.gradient_checkpointing for layer in module.model.layers] == [True] * len(module.model.layers)
    start = weights(trainers["plain"])
    payloads = [trainer.export_weights(rollouts_trained=0) for trainer in trainers.values()]
    rollout = make_rollout(embedded, engine_with(embedded, payloads[0]), 0)
    for trainer in trainers.values():
        _reseed(backend)  # megatron's RNG tracker is one per process: both trainers start from the same state
        train_on(trainer, 0, rollout, expected_staleness=0)
    plain, recomputed = weights(trainers["plain"]), weights(trainers["recompute"])
    assert max_change(start, plain) > 1e-4  # the step trained
    # w - lr * g rounds to float32: gradients equal to 1e-6 of the step, plus an ulp or two of the largest weight
    largest = max(float(w.abs().max()) for w in plain.values() if torch.is_tensor(w))
    ulps = 2 * torch.finfo(torch.float32).eps * largest
    assert max_change(plain, recomputed) <= 1e-6 * max_change(start, plain) + ulps
