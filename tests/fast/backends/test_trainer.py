"""The train actor without Ray: ``run_optimizer_steps`` against optimizer steps written out by hand on a toy
linear model, and ``PolicyTrainer`` in-process on the embedded default with a real ``TorchRolloutEngine``."""

import copy
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from miles.backends.training_utils import checkpoint
from miles.backends.training_utils.train_model import TrainModel
from miles.backends.train_process import _TrainProcess
from miles.backends.training_utils.optimizer_steps import run_optimizer_steps
from miles.utils.arguments import parse_args
from miles.utils.errors import DivergenceError, MilesConfigError, OffPolicyGuardError
from tests.fast.trainers import engine_with, make_rollout, max_change, policy_trainer, train_on, weights

LR = 0.1

# ---------------------------------------------------------------------------------------------------------------
# run_optimizer_steps on a toy problem: sample i has L_i tokens with features x (L_i, 3), targets y (L_i,) and a
# loss mask; the per-token loss is (w·x + b − y)². Per sample it is reduced as a masked token mean (or, per token,
# a masked token sum); the step's loss divides by the step's samples (or unmasked tokens).
# ---------------------------------------------------------------------------------------------------------------

TOKEN_COUNTS = [3, 1, 4, 2, 5, 2, 3, 1]


def _toy_data():
    generator = torch.Generator().manual_seed(0)
    features = [torch.randn(n, 3, generator=generator) for n in TOKEN_COUNTS]  # (L_i, 3) each
    targets = [torch.randn(n, generator=generator) for n in TOKEN_COUNTS]  # (L_i,) each
    masks = [torch.tensor([1] * (n - 1) + [n % 2]) for n in TOKEN_COUNTS]  # some last tokens masked out
    return features, targets, masks


def _toy_model() -> torch.nn.Linear:
    torch.manual_seed(3)
    return torch.nn.Linear(3, 1)


def _sample_losses(model, features, targets, masks, indices, per_token: bool) -> list[torch.Tensor]:
    losses = []
    for i in indices:
        token_losses = (model(features[i]).squeeze(-1) - targets[i]) ** 2 * masks[i]  # (L_i,)
        total = token_losses.sum()
        losses.append(total if per_token else total / masks[i].sum().clamp(min=1))
    return losses


def _run(micro_batch_size: int, global_batch_size: int, per_token: bool, clip_grad: float = 1e9):
    features, targets, masks = _toy_data()
    model = _toy_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    steps = []
    original_step = optimizer.step
    optimizer.step = lambda: (steps.append(1), original_step())[1]

    def micro_batch_loss(indices, divisor):
        losses = _sample_losses(model, features, targets, masks, indices, per_token)
        metrics = {"sample_loss": float(torch.stack(losses).detach().mean()), "index": sum(indices) / len(indices)}
        return torch.stack(losses).sum() / divisor, metrics

    metrics = run_optimizer_steps(TrainModel(model).clip_grad_norm, optimizer, masks, global_batch_size,
                                  micro_batch_size, per_token, clip_grad, micro_batch_loss)
    return model, metrics, len(steps)


def _reference_steps(global_batch_size: int, per_token: bool, clip_grad: float = 1e9):
    """Plain SGD on whole global batches, the divisor counted here, gradient clipping written out."""
    features, targets, masks = _toy_data()
    model = _toy_model()
    grad_norms = []
    for start in range(0, len(TOKEN_COUNTS), global_batch_size):
        indices = range(start, min(start + global_batch_size, len(TOKEN_COUNTS)))
        divisor = sum(int(masks[i].sum()) for i in indices) if per_token else len(indices)
        model.zero_grad()
        (sum(_sample_losses(model, features, targets, masks, indices, per_token)) / divisor).backward()
        grads = [p.grad for p in model.parameters()]
        norm = float(torch.sqrt(sum((g**2).sum() for g in grads)))
        scale = min(1.0, clip_grad / (norm + 1e-6))
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * scale * p.grad
        grad_norms.append(norm)
    return model, grad_norms


def _assert_same_parameters(actual: torch.nn.Module, expected: torch.nn.Module) -> None:
    for a, e in zip(actual.parameters(), expected.parameters(), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("micro_batch_size", [1, 3, 8])
def test_one_step_does_not_depend_on_micro_batching(micro_batch_size, per_token):
    model, metrics, num_steps = _run(micro_batch_size, global_batch_size=8, per_token=per_token)
    expected, grad_norms = _reference_steps(global_batch_size=8, per_token=per_token)
    assert num_steps == 1
    _assert_same_parameters(model, expected)
    assert metrics["grad_norm"] == pytest.approx(grad_norms[0], rel=1e-5)
    assert not torch.allclose(model.weight, _toy_model().weight)  # the step moved the parameters


@pytest.mark.parametrize("micro_batch_size", [1, 3, 4])
def test_two_global_batches_make_two_steps(micro_batch_size):
    model, metrics, num_steps = _run(micro_batch_size, global_batch_size=4, per_token=False)
    expected, grad_norms = _reference_steps(global_batch_size=4, per_token=False)
    assert num_steps == 2
    _assert_same_parameters(model, expected)
    assert metrics["grad_norm"] == pytest.approx(sum(grad_norms) / 2, rel=1e-5)


def test_gradient_clipping_scales_the_step():
    model, metrics, _ = _run(micro_batch_size=3, global_batch_size=8, per_token=False, clip_grad=0.05)
    expected, grad_norms = _reference_steps(global_batch_size=8, per_token=False, clip_grad=0.05)
    assert grad_norms[0] > 0.05  # the clip acts
    _assert_same_parameters(model, expected)
    assert metrics["grad_norm"] == pytest.approx(grad_norms[0], rel=1e-5)  # reported before clipping


@pytest.mark.parametrize(("micro_batch_size", "global_batch_size"), [(3, 8), (3, 4), (5, 8), (1, 8)])
def test_metrics_are_sample_weighted_means(micro_batch_size, global_batch_size):
    _, metrics, _ = _run(micro_batch_size, global_batch_size, per_token=False)
    # Each micro-batch reports the mean index of its samples; weighted by size, that is the mean of 0..7 = 3.5.
    # An unweighted mean of micro-batch means would give e.g. (1 + 4 + 6.5) / 3 for micro-batches of 3, 3, 2.
    assert metrics["index"] == pytest.approx(3.5)
    features, targets, masks = _toy_data()
    with torch.no_grad():
        initial = _sample_losses(_toy_model(), features, targets, masks, range(8), per_token=False)
    if global_batch_size == 8:  # one step: every micro-batch's loss is taken at the initial parameters
        assert metrics["sample_loss"] == pytest.approx(float(torch.stack(initial).mean()), rel=1e-6)


def _diverging_run(global_batch_size: int, first_bad_sample: int, poison: float):
    """Like ``_run`` with SGD, but every sample from ``first_bad_sample`` on adds ``poison`` (nan or inf) to the loss
    through a weight, so the loss and gradient become non-finite from the step that holds that sample."""
    features, targets, masks = _toy_data()
    model = _toy_model()
    before = copy.deepcopy(model)

    def micro_batch_loss(indices, divisor):
        losses = torch.stack(_sample_losses(model, features, targets, masks, indices, per_token=False))
        poisoned = poison * model.bias.abs().sum() if max(indices) >= first_bad_sample else 0.0
        return (losses.sum() + poisoned) / divisor, {}

    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    with pytest.raises(DivergenceError) as caught:
        run_optimizer_steps(TrainModel(model).clip_grad_norm, optimizer, masks, global_batch_size, 3, False, 1.0,
                            micro_batch_loss, where="rollout 7, actor")
    return model, before, caught.value


@pytest.mark.parametrize("poison, metric", [(float("nan"), "loss is nan"), (float("inf"), "loss is inf")])
def test_a_non_finite_loss_stops_before_its_step_changes_any_weight(poison, metric):
    model, before, error = _diverging_run(global_batch_size=8, first_bad_sample=5, poison=poison)
    assert f"rollout 7, actor: the {metric} at optimizer step 1, before it was applied" in str(error)
    assert "lower --lr" in str(error) and not error.weights_changed
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before.state_dict()[name]), name


def test_a_non_finite_gradient_norm_with_a_finite_loss_is_caught_too():
    model = _toy_model()
    masks = _toy_data()[2]

    def micro_batch_loss(indices, divisor):  # value 0, gradient 0·∞ = nan through sqrt at 0
        return torch.sqrt(model.bias.sum() * 0).sum(), {}

    with pytest.raises(DivergenceError, match="the gradient norm is nan at optimizer step 1"):
        run_optimizer_steps(TrainModel(model).clip_grad_norm, torch.optim.SGD(model.parameters(), lr=LR), masks, 8,
                            8, False, 1.0, micro_batch_loss)


def test_divergence_in_a_later_step_says_the_weights_already_changed():
    model, _, error = _diverging_run(global_batch_size=4, first_bad_sample=4, poison=float("nan"))
    assert "at optimizer step 2" in str(error) and error.weights_changed
    expected, _ = _reference_steps(global_batch_size=4, per_token=False, clip_grad=1.0)
    first_step_only = _reference_after_one_step(clip_grad=1.0)
    _assert_same_parameters(model, first_step_only)  # the finite first step was applied, the second was not
    assert not torch.allclose(expected.weight, first_step_only.weight)


def _reference_after_one_step(clip_grad: float) -> torch.nn.Module:
    features, targets, masks = _toy_data()
    model = _toy_model()
    (sum(_sample_losses(model, features, targets, masks, range(4), per_token=False)) / 4).backward()
    norm = float(torch.sqrt(sum((p.grad**2).sum() for p in model.parameters())))
    with torch.no_grad():
        for p in model.parameters():
            p -= LR * min(1.0, clip_grad / (norm + 1e-6)) * p.grad
    return model


@pytest.mark.parametrize("first_bad_sample, still_holds", [(0, 3), (4, None), (8, 4)])
def test_a_train_process_knows_which_rollout_its_weights_hold(first_bad_sample, still_holds):
    """What a save on a stop relies on: 3 before rollout 4; kept when rollout 4 diverged before changing weights."""
    features, targets, masks = _toy_data()
    args = parse_args(argv=["--global-batch-size", "4", "--micro-batch-size", "4", "--lr", str(LR)])
    process = _TrainProcess(args, TrainModel(_toy_model()))
    process.trained_rollout = 3

    def micro_batch_loss(indices, divisor):
        losses = torch.stack(_sample_losses(process.model.module, features, targets, masks, indices, per_token=False))
        return losses.sum() / divisor * (math.nan if max(indices) >= first_bad_sample else 1.0), {}

    if first_bad_sample < len(masks):
        with pytest.raises(DivergenceError):
            process._optimizer_steps(4, masks, micro_batch_loss)
    else:
        process._optimizer_steps(4, masks, micro_batch_loss)
    assert process.trained_rollout_id() == still_holds


# ---------------------------------------------------------------------------------------------------------------
# PolicyTrainer in-process on the embedded default.
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.usefixtures("restore_torch_threads")
def test_keep_old_actor_denominator_matches_the_engine_that_generated_the_rollout(embedded):
    trainer = policy_trainer(embedded, "--keep-old-actor")
    trainer.init()
    engine = engine_with(embedded, trainer.export_weights(rollouts_trained=0))
    first, second = make_rollout(embedded, engine, 0), make_rollout(embedded, engine, 1)  # 1 in flight, as in the loop

    before = weights(trainer)
    metrics = train_on(trainer, 0, first, expected_staleness=0)
    assert metrics["off_policy/denominator_behavior_abs_diff_max"] <= 1e-4
    assert metrics["off_policy/staleness_max"] == 0
    assert max_change(before, weights(trainer)) > 1e-4  # the optimizer step moved the weights

    # The async order with interval 1: push W_1 as version 2 after training rollout 0. Rollout 1 was generated by
    # W_0 (version 1) and is trained by W_1: the snapshot, not the current actor, must be the denominator.
    trainer.export_weights(rollouts_trained=1)
    after_first = weights(trainer)
    metrics = train_on(trainer, 1, second, expected_staleness=1)
    assert metrics["off_policy/staleness_max"] == 1
    assert metrics["off_policy/behavior_version"] == 1
    assert metrics["off_policy/num_snapshots"] == 2  # version 1 (being trained) and version 2 (on the engines)
    assert metrics["off_policy/denominator_behavior_abs_diff_max"] <= 1e-4
    assert metrics["off_policy/policy_behavior_abs_diff"] > 1e-3  # the current actor has drifted from W_0
    assert max_change(after_first, weights(trainer)) > 1e-4


@pytest.mark.usefixtures("restore_torch_threads")
def test_snapshot_forward_leaves_the_live_weights_in_place(embedded):
    trainer = policy_trainer(embedded, "--keep-old-actor")
    trainer.init()
    engine = engine_with(embedded, trainer.export_weights(rollouts_trained=0))
    rollouts = [make_rollout(embedded, engine, 0), make_rollout(embedded, engine, 1)]
    train_on(trainer, 0, rollouts[0], expected_staleness=0)
    live = weights(trainer)
    trainer.prepare(1, rollouts[1], expected_staleness=1)  # loads the W_0 snapshot for the denominator
    assert max_change(live, weights(trainer)) == 0.0


@pytest.mark.usefixtures("restore_torch_threads")
@pytest.mark.parametrize(
    ("flags", "expected_passes"),
    [(["--use-rollout-logprobs"], 0), (["--use-rollout-logprobs", "--get-mismatch-metrics"], 1), ([], 1)],
    ids=["rollout-logprobs", "rollout-logprobs+mismatch-metrics", "no-correction"],
)
def test_recompute_pass_runs_only_when_needed(embedded, monkeypatch, flags, expected_passes):
    trainer = policy_trainer(embedded, *flags)
    trainer.init()
    engine = engine_with(embedded, trainer.export_weights(rollouts_trained=0))
    calls = []
    original = trainer._forward_log_probs
    monkeypatch.setattr(trainer, "_forward_log_probs", lambda *a, **k: (calls.append(1), original(*a, **k))[1])
    before = weights(trainer)
    metrics = train_on(trainer, 0, make_rollout(embedded, engine, 0), expected_staleness=0)
    assert len(calls) == expected_passes
    assert ("off_policy/denominator_behavior_abs_diff_max" in metrics) == (expected_passes == 1)
    assert max_change(before, weights(trainer)) > 1e-4


@pytest.mark.usefixtures("restore_torch_threads")
def test_a_refused_rollout_is_neither_trained_nor_pushed(embedded):
    """The driver submits prepare, train and the push's export together (Ray runs them in order in the actor): when
    the guard refuses the rollout, train and the export must fail too, and leave the weights and versions as they
    are, rather than train on nothing or push untrained weights as the next version."""
    trainer = policy_trainer(embedded)
    trainer.init()
    engine = engine_with(embedded, trainer.export_weights(rollouts_trained=0))
    rollout = make_rollout(embedded, engine, 0)
    before = weights(trainer)
    with pytest.raises(OffPolicyGuardError):
        trainer.prepare(0, rollout, expected_staleness=1)  # the sync loop's rollouts are never stale
    with pytest.raises(RuntimeError, match="rollout 0 is not trained: its prepare failed"):
        trainer.train(0)
    with pytest.raises(RuntimeError, match="weight version 2 is not pushed: .* rollout 0, which failed"):
        trainer.export_weights(rollouts_trained=1, after_training=True)
    assert max_change(before, weights(trainer)) == 0.0
    assert trainer.weight_version == 1

    train_on(trainer, 0, rollout, expected_staleness=0)  # the same calls on an accepted rollout
    assert trainer.export_weights(rollouts_trained=1, after_training=True)["version"] == 2


@pytest.mark.usefixtures("restore_torch_threads")
def test_an_exact_resume_restores_the_pushes_and_pushes_the_engines_version_again(embedded, tmp_path):
    """The async order with interval 1 and --keep-old-actor, saved after rollout 1: versions 1 (W_0), 2 (W_1), 3
    (W_2) were pushed; rollout 2 (in flight) was generated by version 2 and the engines hold version 3. The resumed
    actor holds the same tables and snapshots, and its start-up push is version 3 again, bit for bit."""
    save = ["--save", str(tmp_path), "--load", str(tmp_path)]
    trainer = policy_trainer(embedded, "--keep-old-actor", *save)
    trainer.init()
    engine = engine_with(embedded, trainer.export_weights(rollouts_trained=0))
    rollouts = [make_rollout(embedded, engine, 0), make_rollout(embedded, engine, 1)]
    train_on(trainer, 0, rollouts[0], expected_staleness=0)
    engine.load_weights(trainer.export_weights(rollouts_trained=1)["state_dict"], 2)
    rollouts.append(make_rollout(embedded, engine, 2))  # the rollout in flight at the save
    train_on(trainer, 1, rollouts[1], expected_staleness=1)
    pushed = trainer.export_weights(rollouts_trained=2, after_training=True)
    trainer.save(str(tmp_path), 1)
    checkpoint.mark_latest(str(tmp_path), 1)
    saved = checkpoint.load_trainer_state(checkpoint.rollout_dir(str(tmp_path), 1) / "actor")
    assert saved["saved_versions"] == [2]  # version 3 is the actor's own weights

    resumed = policy_trainer(embedded, "--keep-old-actor", *save)
    assert resumed.init(exact_resume=True) == 2
    assert resumed.exporter.version_to_rollouts_trained == {1: 0, 2: 1, 3: 2}
    assert resumed.exporter.pushed_fingerprints == trainer.exporter.pushed_fingerprints
    repushed = resumed.export_weights(rollouts_trained=2)
    assert (repushed["version"], repushed["fingerprint"]) == (3, pushed["fingerprint"])
    assert resumed.exporter.snapshots.versions() == trainer.exporter.snapshots.versions() == [2, 3]
    for name, tensor in trainer.exporter.snapshots.get(2).state_dict.items():
        assert torch.equal(resumed.exporter.snapshots.get(2).state_dict[name], tensor), name
    # The carried rollout passes the same guard as in the straight run: version 2, one rollout stale.
    metrics = train_on(resumed, 2, rollouts[2], expected_staleness=1)
    assert metrics == {**train_on(trainer, 2, rollouts[2], expected_staleness=1),
                       **{key: metrics[key] for key in metrics if key.startswith("perf/")}}


@pytest.mark.usefixtures("restore_torch_threads")
def test_saved_version_weights_that_were_changed_are_refused(embedded, tmp_path):
    save = ["--save", str(tmp_path), "--load", str(tmp_path), "--update-weights-interval", "2"]
    trainer = policy_trainer(embedded, *save)
    trainer.init()
    engine = engine_with(embedded, trainer.export_weights(rollouts_trained=0))
    train_on(trainer, 0, make_rollout(embedded, engine, 0), expected_staleness=0)
    trainer.save(str(tmp_path), 0)  # the engines hold version 1 (W_0), the actor W_1: version 1 is kept
    checkpoint.mark_latest(str(tmp_path), 0)
    folder = checkpoint.version_dir(checkpoint.rollout_dir(str(tmp_path), 0) / "actor", 1)
    weights_file = folder / "model.safetensors"
    tensors = load_file(weights_file)
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 1e-3
    save_file(tensors, weights_file, metadata={"format": "pt"})
    with pytest.raises(MilesConfigError, match=f"{folder} holds weights with fingerprint .* weight version 1 was"):
        policy_trainer(embedded, *save).init(exact_resume=True)


# Dynamic micro-batches (--use-dynamic-batch-size): the same step as the reference, to float rounding. The toy's
# gradient is a sum of 8 per-sample terms of a few float32 products each; grouping them otherwise changes the sum
# by a few ulps (n u sum|g_i|, n = 8, u = 2^-24: ~5e-7 relative for a well-conditioned sum), inside
# _assert_same_parameters' rtol 1e-5.
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("max_tokens", [5, 8, 40])
def test_dynamic_micro_batches_take_the_fixed_step(max_tokens, per_token):
    features, targets, masks = _toy_data()
    model = _toy_model()
    seen = []

    def micro_batch_loss(indices, divisor):
        seen.append(indices)
        losses = _sample_losses(model, features, targets, masks, indices, per_token)
        return torch.stack(losses).sum() / divisor, {"sample_loss": float(torch.stack(losses).detach().mean())}

    metrics = run_optimizer_steps(TrainModel(model).clip_grad_norm, torch.optim.SGD(model.parameters(), lr=LR), masks,
                                  4, 1, per_token, 1e9, micro_batch_loss, lengths=TOKEN_COUNTS,
                                  max_tokens_per_micro_batch=max_tokens)
    expected, grad_norms = _reference_steps(global_batch_size=4, per_token=per_token)
    _assert_same_parameters(model, expected)
    assert metrics["grad_norm"] == pytest.approx(sum(grad_norms) / 2, rel=1e-5)
    fixed_model, fixed_metrics, _ = _run(1, global_batch_size=4, per_token=per_token)
    assert metrics["sample_loss"] == pytest.approx(fixed_metrics["sample_loss"], rel=1e-5)
    # each step's samples, cut within the padded budget (5: the 5-token sample alone), never across steps
    assert sorted(i for mb in seen for i in mb) == list(range(8))
    assert all(set(mb) <= {0, 1, 2, 3} or set(mb) <= {4, 5, 6, 7} for mb in seen)
    for mb in seen:
        assert len(mb) * max(TOKEN_COUNTS[i] for i in mb) <= max_tokens
    assert len(seen) == {5: 6, 8: 5, 40: 2}[max_tokens]  # 8: [2, 0], [3, 1] | [4], [6, 5], [7]
