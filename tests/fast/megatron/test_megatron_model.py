"""The megatron backend against the torch backend on the same weights: log-probs, values, one optimizer step of
the actor and of the critic, the push fingerprint, keep-old-actor snapshots and checkpoints in either direction.

Tolerances: both backends compute in float32 with different kernels (fused QKV, megatron's attention), so they
agree to float32 rounding accumulated over a few layers (~1e-7 measured on the embedded default). Derived: float32's
unit roundoff is 6e-8; each of the 2 layers adds a few roundings per sum of <= 256 terms of O(1) values (~sqrt(256)
* 6e-8 ~ 1e-6 worst case per layer, in the hidden state and then the log-softmax), so 1e-5 bounds 2 layers with a
margin while still catching a wrong layout, mask, norm or position (those move log-probs by > 1e-2).

The checkpoints: the embedded default (Qwen2, tied, MHA), a random GQA Qwen2 (untied, rope_theta 500) and the tiny
Qwen3 (tests/tiny_qwen3.py: q/k norms, no qkv bias, head_dim 16 != hidden / heads); the torch backend runs
transformers' own Qwen2ForCausalLM / Qwen3ForCausalLM, the independent reference.
"""

import dataclasses

import pytest
import torch

from miles.backends import load_train_model
from miles.backends.megatron_backend.qwen2 import hf_to_megatron, megatron_to_hf
from miles.backends.megatron_backend.tensor_parallel import shard_state, unshard_tensor
from miles.backends.train_process import ValueTrainer
from miles.guard.fingerprint import weights_fingerprint
from miles.utils.errors import OffPolicyGuardError
from miles.utils.types import Sample
from tests.fast.trainers import (
    engine_with,
    make_rollout,
    max_change,
    policy_trainer,
    train_on,
    trainer_args,
)
from tests.tiny_qwen2 import save_gqa_qwen2

pytestmark = [pytest.mark.megatron, pytest.mark.usefixtures("restore_torch_threads")]


def _sample(prompt: list[int], response: list[int], index: int) -> Sample:
    return Sample(group_index=index, index=index, prompt="", label="", tokens=prompt + response,
                  response_length=len(response))


# Different prompt and response lengths, so right padding and the response positions differ per row.
SAMPLES = [_sample([1, 3, 12], [4, 2], 0), _sample([1, 5, 12, 5, 13], [2], 1), _sample([1], [4, 5, 6, 7, 8, 2], 2)]


@pytest.fixture(scope="module")
def gqa_checkpoint(tmp_path_factory) -> str:
    """A random Qwen2 with grouped-query attention (4 heads, 2 KV groups) and untied embeddings, saved as HF."""
    return save_gqa_qwen2(tmp_path_factory.mktemp("gqa"), num_hidden_layers=2)


@pytest.fixture(params=["embedded", "gqa", "qwen3"])
def checkpoint_dir(request, embedded, gqa_checkpoint, qwen3_checkpoint) -> str:
    return {"embedded": embedded.checkpoint_dir, "gqa": gqa_checkpoint, "qwen3": qwen3_checkpoint}[request.param]


def _assert_lists_close(actual: list[torch.Tensor], expected: list[torch.Tensor], atol: float) -> None:
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=atol)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_and_entropies_match_the_torch_backend(checkpoint_dir, temperature):
    megatron, torch_model = (load_train_model(b, "actor", checkpoint_dir, seed=0) for b in ("megatron", "torch"))
    with torch.no_grad():
        log_probs, entropies = megatron.response_log_probs(SAMPLES, temperature, with_entropy=True)
        expected_log_probs, expected_entropies = torch_model.response_log_probs(SAMPLES, temperature, True)
    _assert_lists_close(log_probs, expected_log_probs, atol=1e-5)
    _assert_lists_close(entropies, expected_entropies, atol=1e-5)
    assert [len(lp) for lp in log_probs] == [2, 1, 6]


def test_log_probs_under_a_kept_set_match_a_direct_computation(embedded):
    """Samples of a truncated sampler: the megatron backend scores each token by a log-softmax over the kept ids
    only, like the torch backend's logits masked by hand here."""
    kept = [[[2, 4, 9], [2, 5]], [[2, 3]], [[4, 7], [5, 6], [6], [7, 8, 9], [8, 0], [2]]]
    samples = [Sample(**{**vars(s), "sampling_kept_ids": ids}) for s, ids in zip(SAMPLES, kept, strict=True)]
    megatron, torch_model = (load_train_model(b, "actor", embedded.checkpoint_dir, seed=0) for b in ("megatron", "torch"))
    with torch.no_grad():
        log_probs, _ = megatron.response_log_probs(samples, 0.7)
        for sample, ids, actual in zip(samples, kept, log_probs, strict=True):
            logits = torch_model.module(input_ids=torch.tensor([sample.tokens])).logits[0] / 0.7  # (T, V)
            for t, token in enumerate(sample.tokens[sample.prompt_length:]):
                row = logits[sample.prompt_length - 1 + t, ids[t]]
                expected = torch.log_softmax(row, dim=-1)[ids[t].index(token)]
                assert float(actual[t]) == pytest.approx(float(expected), abs=1e-5)


def test_the_pushed_weights_are_the_hf_weights_and_fingerprint_identically(checkpoint_dir):
    megatron, torch_model = (load_train_model(b, "actor", checkpoint_dir, seed=0) for b in ("megatron", "torch"))
    pushed, expected = megatron.hf_state_dict(), torch_model.hf_state_dict()
    assert set(pushed) == set(expected)  # incl. lm_head.weight of a tied model: the engine's state_dict lists it
    assert all(torch.equal(pushed[name], expected[name]) for name in expected)
    assert weights_fingerprint(pushed) == weights_fingerprint(expected)  # the same tensors, hashed the same way


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_a_new_critic_starts_from_the_torch_backends_initialization_and_gives_its_values(embedded, qwen3_checkpoint,
                                                                                          family):
    folder = embedded.checkpoint_dir if family == "qwen2" else qwen3_checkpoint
    megatron, torch_model = (load_train_model(b, "critic", folder, seed=7) for b in ("megatron", "torch"))
    assert weights_fingerprint(megatron.hf_state_dict()) == weights_fingerprint(torch_model.hf_state_dict())
    with torch.no_grad():
        _assert_lists_close(megatron.response_values(SAMPLES), torch_model.response_values(SAMPLES), atol=1e-5)


def _relative_gap(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def _gradients_in_hf_layout(model) -> dict[str, torch.Tensor]:
    """The last step's (clipped) gradients, named and laid out as the HF model's parameters."""
    grads = {name: param.grad for name, param in model.module.named_parameters()}
    return megatron_to_hf(grads, model.layout) if hasattr(model, "layout") else grads


def _assert_same_step(trainers: dict, before: dict[str, torch.Tensor]) -> None:
    """The step of each backend: the same gradients (to 1e-5 of their norm), and the same updated weights (the
    whole parameter vector to 1e-5 relative). Not per element: Adam's first update is lr * g / (|g| + eps), so a
    parameter whose exact gradient is 0 (k_proj's bias: softmax ignores a shift shared by all keys) moves by
    up to lr along float noise, differently on each backend, although the gradients agree to 1e-7."""
    grads = {backend: _gradients_in_hf_layout(trainer.model) for backend, trainer in trainers.items()}
    grad_norm = float(torch.sqrt(sum((g**2).sum() for g in grads["torch"].values())))
    for name, expected in grads["torch"].items():
        assert float((grads["megatron"][name] - expected).abs().max()) <= 1e-5 * grad_norm, name
    updated = {backend: trainer.model.hf_state_dict() for backend, trainer in trainers.items()}
    assert max_change(before, updated["torch"]) > 1e-4  # the step did something to compare

    def norm(tensors) -> float:
        return float(torch.sqrt(sum((t**2).sum() for t in tensors)))

    gap = norm(updated["megatron"][name] - updated["torch"][name] for name in updated["torch"])
    assert gap <= 1e-5 * norm(updated["torch"].values())


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_one_actor_step_matches_the_torch_backend(embedded, qwen3_checkpoint, family):
    """Same seeds, same samples, same denominator: metrics and updated weights agree within 1e-5 relative. On the
    tiny Qwen3 too (the embedded default's prompts and tokenizer, the Qwen3 weights): the torch backend runs
    transformers' Qwen3ForCausalLM, so the megatron backend's q/k norms and head_dim meet an independent step."""
    if family == "qwen3":
        embedded = dataclasses.replace(embedded, checkpoint_dir=qwen3_checkpoint)
    trainers = {b: policy_trainer(embedded, "--train-backend", b, "--lr", "1e-3") for b in ("torch", "megatron")}
    payload = trainers["torch"].export_weights(rollouts_trained=0)
    rollout = make_rollout(embedded, engine_with(embedded, payload), 0)
    trainers["megatron"].export_weights(rollouts_trained=0)
    metrics = {b: train_on(trainer, 0, rollout, expected_staleness=0) for b, trainer in trainers.items()}
    for name in ("train/grad_norm", "train/entropy_loss"):
        assert _relative_gap(metrics["megatron"][name], metrics["torch"][name]) <= 1e-5, name
    # With the denominator equal to the current weights the ratio is 1 and GRPO's advantages sum to 0 per group,
    # so the policy loss and ppo_kl are float noise around 0 on both backends: compared absolutely.
    for name in ("train/pg_loss", "train/ppo_kl"):
        assert abs(metrics["megatron"][name] - metrics["torch"][name]) <= 1e-6, name
    _assert_same_step(trainers, payload["state_dict"])


def test_one_critic_step_matches_the_torch_backend(embedded):
    args = {b: trainer_args(embedded, "--advantage-estimator", "ppo", "--train-backend", b, "--critic-lr", "1e-3")
            for b in ("torch", "megatron")}
    critics = {b: ValueTrainer(a, num_threads=1) for b, a in args.items()}
    payload = policy_trainer(embedded).export_weights(rollouts_trained=0)
    rollout = make_rollout(embedded, engine_with(embedded, payload), 0)
    before = critics["torch"].model.hf_state_dict()
    metrics = {}
    for backend, critic in critics.items():
        metrics[backend] = critic.train(0, rollout, critic.compute_values(rollout))
    for name in ("critic/value_loss", "critic/grad_norm"):
        assert _relative_gap(metrics["megatron"][name], metrics["torch"][name]) <= 1e-5, name
    _assert_same_step(critics, before)


def test_keep_old_actor_snapshots_give_the_engines_log_probs_and_catch_a_corrupted_shard(embedded):
    trainer = policy_trainer(embedded, "--train-backend", "megatron", "--keep-old-actor")
    trainer.init()
    engine = engine_with(embedded, trainer.export_weights(rollouts_trained=0))
    first, second = make_rollout(embedded, engine, 0), make_rollout(embedded, engine, 1)
    train_on(trainer, 0, first, expected_staleness=0)
    trainer.export_weights(rollouts_trained=1)
    metrics = train_on(trainer, 1, second, expected_staleness=1)  # stale by one: the version-1 snapshot is used
    assert metrics["off_policy/behavior_version"] == 1
    assert metrics["off_policy/denominator_behavior_abs_diff_max"] <= 1e-4
    assert metrics["off_policy/policy_behavior_abs_diff"] > 1e-3  # the live weights moved away from version 1

    third = make_rollout(embedded, engine_with(embedded, trainer.export_weights(rollouts_trained=2)), 2)
    snapshot = trainer.exporter.snapshots._snapshots[3]
    snapshot.state_dict["decoder.layers.1.self_attention.linear_qkv.weight"][0, 0] += 1e-3  # a fused Megatron shard
    with pytest.raises(OffPolicyGuardError, match="whose weights now have fingerprint") as caught:
        trainer.prepare(2, third, expected_staleness=0)
    # The HF tensor the fused shard's first row belongs to (q of layer 1) is named.
    assert "tensors that differ from the push: model.layers.1.self_attn.q_proj.weight (changed)" in str(caught.value)


@pytest.mark.parametrize(("writer", "reader"), [("megatron", "torch"), ("torch", "megatron")])
def test_a_checkpoint_of_one_backend_loads_into_the_other(embedded, tmp_path, writer, reader):
    trained = policy_trainer(embedded, "--train-backend", writer)
    rollout = make_rollout(embedded, engine_with(embedded, trained.export_weights(rollouts_trained=0)), 0)
    train_on(trained, 0, rollout, expected_staleness=0)
    saved = trained.model.hf_state_dict()
    trained.model.save_pretrained(tmp_path)
    loaded = load_train_model(reader, "actor", str(tmp_path), seed=0).hf_state_dict()
    assert set(loaded) == set(saved)
    assert all(torch.equal(loaded[name], saved[name]) for name in saved)


def test_a_qwen3_state_shards_over_tensor_parallel_ranks_with_replicated_qk_norms(qwen3_checkpoint):
    """Megatron's q/k layernorms normalize each head over head_dim, so every rank holds them whole; the HF state
    comes back bit for bit from the shards."""
    model = load_train_model("megatron", "actor", qwen3_checkpoint, seed=0)
    hf = model.hf_state_dict()
    whole = hf_to_megatron(hf, model.layout)
    norms = [name for name in whole if name.endswith(("q_layernorm.weight", "k_layernorm.weight"))]
    assert len(norms) == 4 and not set(norms) & set(model.partition_dims)
    shards = [shard_state(whole, model.partition_dims, rank, 2, 15) for rank in range(2)]
    assert all(torch.equal(shard[name], whole[name]) for shard in shards for name in norms)
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    assert [shard[qkv].shape[0] for shard in shards] == [64, 64]  # one whole query group (2 q + k + v heads) each
    back = {name: unshard_tensor(name, [shard[name] for shard in shards], model.partition_dims[name], 15)
            if name in model.partition_dims else shards[0][name] for name in whole}
    restored = megatron_to_hf(back, model.layout)
    assert set(restored) == set(hf) and all(torch.equal(restored[name], hf[name]) for name in hf)
