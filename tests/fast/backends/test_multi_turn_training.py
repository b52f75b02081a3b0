"""Multi-turn samples in the trainer: the tokens a tool added (loss mask 0, log-prob 0.0, as upstream's agents write
them) stay out of the guard's denominator check and the mismatch metrics, so --keep-old-actor's check holds on the
engine's turns, and a stale snapshot's mismatch on a turn is still caught."""

import pytest
import torch

from miles.rollout.engine import TorchRolloutEngine
from miles.utils.errors import OffPolicyGuardError
from miles.utils.types import RolloutBatch, Sample
from tests.fast.trainers import engine_with, make_rollout, policy_trainer

TOOL = "+1="


def two_turn_rollout(engine: TorchRolloutEngine, rollout: RolloutBatch, temperature: float) -> RolloutBatch:
    """Each sample of ``rollout`` continued as an agent would: the tool's tokens (mask 0, log-prob 0.0), then a second
    engine turn generated after all of it."""
    tool = engine.tokenizer.encode(TOOL, add_special_tokens=False)
    contexts = [sample.tokens + tool for sample in rollout.samples]
    second, versions = engine.generate_rows(contexts, 1, temperature, 3, seed=7)
    samples = []
    for sample, context, turn, version in zip(rollout.samples, contexts, second, versions, strict=True):
        samples.append(Sample(
            group_index=sample.group_index, index=sample.index, prompt=sample.prompt, label=sample.label,
            tokens=context + turn.tokens, response_length=sample.response_length + len(tool) + len(turn.tokens),
            reward=sample.reward, loss_mask=sample.loss_mask + [0] * len(tool) + [1] * len(turn.tokens),
            rollout_log_probs=sample.rollout_log_probs + [0.0] * len(tool) + turn.log_probs,
            weight_versions=version, weight_fingerprint=sample.weight_fingerprint))
    return RolloutBatch(rollout.rollout_id, samples)


@pytest.fixture
def keep_old_actor_and_rollout(embedded, restore_torch_threads):
    """A fresh --keep-old-actor actor and a two-turn rollout of the engine holding its first push (version 1)."""
    trainer = policy_trainer(embedded, "--keep-old-actor")
    trainer.init()
    engine = engine_with(embedded, trainer.export_weights(rollouts_trained=0))
    return trainer, two_turn_rollout(engine, make_rollout(embedded, engine, 0), temperature=0.9)


def test_keep_old_actor_checks_the_engines_turns_and_not_the_tools_tokens(keep_old_actor_and_rollout):
    trainer, rollout = keep_old_actor_and_rollout
    metrics = trainer.prepare(0, rollout, expected_staleness=0)
    # the snapshot's recompute against the engine's turns (float32, the guard's 1e-4); the tool's tokens, whose
    # recomputed log-prob is that of a token the policy never chose (about -2.7 = log 1/15 here), are not compared
    assert metrics["off_policy/denominator_behavior_abs_diff_max"] <= 1e-4
    assert metrics["off_policy/tis_raw_max"] == pytest.approx(1.0, abs=1e-3)
    trained = trainer.train(0)
    assert torch.isfinite(torch.tensor(trained["train/pg_loss"]))


def test_a_turn_the_snapshot_disagrees_with_is_still_refused(keep_old_actor_and_rollout):
    trainer, rollout = keep_old_actor_and_rollout
    sample = rollout.samples[0]
    sample.rollout_log_probs[-1] -= 0.5  # a second-turn token whose log-prob is not the engine's
    with pytest.raises(OffPolicyGuardError, match="denominator"):
        trainer.prepare(0, rollout, expected_staleness=0)
