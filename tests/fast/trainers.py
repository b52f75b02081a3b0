"""Train processes in-process, the way the driver uses them, on the embedded default with a real engine."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from miles.backends.train_process import PolicyTrainer
from miles.rollout.embedded import EmbeddedPaths
from miles.rollout.engine import TorchRolloutEngine
from miles.utils.arguments import parse_args
from miles.utils.types import RolloutBatch

NUM_PROMPTS, SAMPLES_PER_PROMPT, TEMPERATURE = 4, 4, 0.9


def trainer_args(embedded: EmbeddedPaths, *flags: str):
    args = parse_args(argv=[
        "--advantage-estimator", "grpo", "--rollout-batch-size", str(NUM_PROMPTS),
        "--n-samples-per-prompt", str(SAMPLES_PER_PROMPT), "--micro-batch-size", "8",
        "--rollout-temperature", str(TEMPERATURE), "--lr", "1e-2",
        "--train-backend", "torch", *flags,  # tests that compare backends pass theirs after it
    ])
    args.hf_checkpoint = embedded.checkpoint_dir
    return args


def policy_trainer(embedded: EmbeddedPaths, *flags: str) -> PolicyTrainer:
    return PolicyTrainer(trainer_args(embedded, *flags), num_threads=1)


def make_rollout(embedded: EmbeddedPaths, engine: TorchRolloutEngine, rollout_id: int) -> RolloutBatch:
    prompts = [json.loads(line) for line in Path(embedded.train_jsonl).read_text().splitlines()[:NUM_PROMPTS]]
    samples = engine.generate(prompts, SAMPLES_PER_PROMPT, TEMPERATURE, max_response_len=3, seed=rollout_id)
    for sample in samples:  # rewards that differ within every group, so GRPO's advantages are not all zero
        sample.reward = float(sample.index % 2)
    return RolloutBatch(rollout_id, samples)


def engine_with(embedded: EmbeddedPaths, payload: dict) -> TorchRolloutEngine:
    engine = TorchRolloutEngine(embedded.checkpoint_dir, seed=0, num_threads=1)
    engine.load_weights(payload["state_dict"], payload["version"])
    return engine


def train_on(trainer: PolicyTrainer, rollout_id: int, rollout: RolloutBatch, expected_staleness: int) -> dict:
    """What the driver does per rollout: the guard and denominator (``prepare``), then the optimizer steps; the
    metrics of both, as the driver logs them."""
    guard_report = trainer.prepare(rollout_id, rollout, expected_staleness)
    return {**guard_report, **trainer.train(rollout_id)}


def weights(trainer) -> dict[str, torch.Tensor]:
    return copy.deepcopy(trainer.model.module.state_dict())


def max_change(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    return max(float((before[name] - after[name]).abs().max()) for name in before if torch.is_tensor(before[name]))


def metrics_of_one_trained_rollout(embedded: EmbeddedPaths, *flags: str) -> dict:
    """A fresh GRPO actor with ``flags`` prepared and trained on rollout 0 of a real engine: its metrics without the
    ``perf/`` timings, and the fingerprint of the weights it pushes after the step ("pushed fingerprint")."""
    trainer = policy_trainer(embedded, "--advantage-estimator", "grpo", *flags)
    trainer.init()
    engine = engine_with(embedded, trainer.export_weights(rollouts_trained=0))
    metrics = trainer.prepare(0, make_rollout(embedded, engine, 0), expected_staleness=0)
    metrics.update(trainer.train(0))
    metrics["pushed fingerprint"] = trainer.export_weights(rollouts_trained=1, after_training=True)["fingerprint"]
    return {name: value for name, value in metrics.items() if not name.startswith("perf/")}
