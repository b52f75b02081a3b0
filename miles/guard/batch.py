"""The guard's per-batch check, as the trainer calls it before any weight changes (docs/design.md §4).

``BatchGuard`` runs the checks of ``off_policy`` that need no forward pass on a rollout's samples (one version
each, staleness as the loop's order implies, the engines' fingerprints against the pushes, the engine log-probs a
row needs), the contract on the batch, and the snapshot denominator's tolerance; it times itself, so the run
reports what the guard costs.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from miles.config import corrections
from miles.config.corrections import InEffect
from miles.guard import off_policy
from miles.utils.types import Sample


@dataclass(frozen=True)
class GuardConfig:
    """The flags the per-batch guard reads, built once from ``args``."""

    corrections: InEffect
    use_critic: bool  # PPO: a stale batch needs a row that satisfies the contract
    max_weight_staleness: int | None
    snapshot_tolerance: float  # --keep-old-actor-tol: max |old − roll| per token under the SNAPSHOT denominator

    @classmethod
    def from_args(cls, args) -> GuardConfig:
        return cls(corrections.in_effect(args), args.use_critic, args.max_weight_staleness, args.keep_old_actor_tol)


class BatchGuard:
    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self.seconds = 0.0  # the checks' time on the current rollout, from its ``check_provenance`` (which resets it)

    @contextlib.contextmanager
    def timed(self):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - start

    def check_provenance(self, rollout_id: int, samples: list[Sample], expected_staleness: int,
                         version_to_rollouts_trained: dict[int, int], pushed_fingerprints: dict[int, str]) -> list[int]:
        """Versions, staleness, pushed fingerprints, engine log-probs; then the contract. Returns each sample's
        staleness. Raises ``OffPolicyGuardError`` on the first violation."""
        self.seconds = 0.0
        with self.timed():
            versions = off_policy.check_one_version_per_sample(rollout_id, [s.weight_versions for s in samples])
            staleness = off_policy.sample_staleness(rollout_id, versions, version_to_rollouts_trained)
            off_policy.check_staleness(rollout_id, staleness, expected_staleness, self.config.max_weight_staleness)
            off_policy.check_engine_loaded_pushed_weights(
                rollout_id, versions, [s.weight_fingerprint for s in samples], pushed_fingerprints)
            if self.config.corrections.needs_rollout_log_probs:
                off_policy.check_rollout_log_probs(
                    rollout_id, [s.rollout_log_probs for s in samples], [s.response_length for s in samples])
            self.check_contract(rollout_id, max(staleness))
        return staleness

    def check_contract(self, rollout_id: int, staleness: int) -> None:
        """The async contract on this batch: a stale PPO rollout needs a correction that satisfies it."""
        off_policy.check_correction_per_batch(rollout_id, staleness, self.config.use_critic, self.config.corrections)

    def check_denominator(self, rollout_id: int, report: dict[str, float]) -> None:
        """Under the SNAPSHOT denominator, max |old − roll| per token within the tolerance (``report`` holds it)."""
        if self.config.corrections.keeps_snapshots:
            with self.timed():
                off_policy.check_denominator_tolerance(
                    rollout_id, report["denominator_behavior_abs_diff_max"], self.config.snapshot_tolerance)
