"""Version-keyed weight snapshots for ``--keep-old-actor``.

Upstream keeps the old actor in a two-slot queue, exact only for ``--update-weights-interval 1``. Here every
weight version pushed to the rollout engines gets a snapshot, looked up by the version stamped on the samples,
so the denominator is computed with exactly the weights that generated the rollout, for every interval.

Release rule (why at most two snapshots exist): pushes happen only after the in-flight generation is drained,
so at a push of version v_new every unconsumed rollout carries the previously pushed version v_prev; no rollout
can reference anything older. And rollouts are trained in order with non-decreasing versions, so training a
rollout of version v releases everything older than v.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from miles.backends.training_utils.train_model import TrainModel, clone_state
from miles.guard import off_policy
from miles.guard.fingerprint import DigestTable, combine_digests, differing_tensors, digest_table
from miles.utils.errors import OffPolicyGuardError


@dataclass(frozen=True)
class WeightSnapshot:
    version: int
    digests: DigestTable  # per HF tensor, its digest at the push (miles.guard.fingerprint)
    state_dict: dict[str, torch.Tensor]  # the trainer's native layout (megatron: fused, sharded)
    native_digests: DigestTable  # per tensor of state_dict, its digest when the snapshot was taken


class WeightSnapshotStore:
    def __init__(self) -> None:
        self._snapshots: dict[int, WeightSnapshot] = {}

    def __len__(self) -> int:
        return len(self._snapshots)

    def versions(self) -> list[int]:
        return sorted(self._snapshots)

    def get(self, version: int) -> WeightSnapshot:
        return self._snapshots[version]

    def add_pushed(self, version: int, state_dict: dict[str, torch.Tensor], digests: DigestTable,
                   native_digests: DigestTable | None = None) -> None:
        """Record the weights pushed as ``version`` (``digests``: the push's, per HF tensor); drop versions no
        unconsumed rollout can still reference. ``native_digests``: those of ``state_dict`` when the caller has them
        (the torch backend's layout is the HF one, so they are ``digests``); otherwise computed from the copy."""
        if self._snapshots and version <= max(self._snapshots):
            raise ValueError(f"weight version {version} is not newer than {max(self._snapshots)}")
        previous = max(self._snapshots, default=None)
        copy = clone_state(state_dict)
        native = digest_table(copy) if native_digests is None else native_digests
        self._snapshots[version] = WeightSnapshot(version, digests, copy, native)
        if previous is not None:
            self._release_older_than(previous)

    def take_for_training(self, version: int, rollout_id: int) -> WeightSnapshot:
        """The snapshot that generated a rollout of ``version``; older ones are released. Missing is an error."""
        if version not in self._snapshots:
            raise OffPolicyGuardError(
                f"rollout {rollout_id} was generated with weight version {version}, but the snapshot store holds "
                f"versions {self.versions()}: the --keep-old-actor denominator cannot be computed with the weights "
                "that generated it, and miles never falls back to the current weights. This is a bug in the loop's "
                "push/release order; please report it with the run's metrics.jsonl."
            )
        self._release_older_than(version)
        return self._snapshots[version]

    def _release_older_than(self, version: int) -> None:
        for old in [v for v in self._snapshots if v < version]:
            del self._snapshots[old]


def verified_snapshot(store: WeightSnapshotStore, model: TrainModel, rollout_id: int, version: int,
                      provenance: set[tuple[int, str]], pushed_fingerprints: dict[int, str]) -> WeightSnapshot:
    """The snapshot of ``version``, which generated rollout ``rollout_id``, checked by the guard against every
    sample's ``provenance`` (its (version, engine fingerprint) pair) before its weights compute a denominator.

    The snapshot's tensors are hashed again, in the trainer's layout, against their digests when it was taken, so a
    wrong tensor under the right label fails. Intact, it holds what was pushed: its fingerprint is the push's.
    Otherwise it is converted to the layout the engines received, so the fingerprint and the error name tensors as
    the engines know them (against the push's digests)."""
    snapshot = store.take_for_training(version, rollout_id)
    differing = ()
    if model.on_every_rank(digest_table(snapshot.state_dict) == snapshot.native_digests):  # TP: all agree
        snapshot_fingerprint = pushed_fingerprints[snapshot.version]  # combine_digests(snapshot.digests)
    else:
        digests = digest_table(model.hf_tensors(snapshot.state_dict))
        snapshot_fingerprint, differing = combine_digests(digests), differing_tensors(snapshot.digests, digests)
    for sample_version, sample_fingerprint in provenance:
        off_policy.check_snapshot_provenance(
            rollout_id, sample_version, sample_fingerprint, snapshot.version, snapshot_fingerprint, differing)
    referenced = [version] + [v for v in pushed_fingerprints if v > version]
    off_policy.check_snapshot_count(rollout_id, store.versions(), referenced, limit=2)
    return snapshot
