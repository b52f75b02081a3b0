"""The actor's pushes: each version's weights for the engines, their fingerprint, and the tables the guard reads.

Version v is the v-th push (docs/design.md §2). Per version the exporter records the rollouts the actor had
trained when it was pushed (``version_to_rollouts_trained``, so staleness never confuses versions with rollouts)
and the fingerprint of exactly the tensors the engines load (``pushed_fingerprints``, which the engines' own hash
must match). It keeps what a later rollout or a save still needs: a snapshot per version when a chosen row's
denominator is SNAPSHOT (``snapshots.py``), else, when asked, the engines' weights once the actor moved past them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from miles.backends.training_utils import checkpoint
from miles.backends.training_utils.snapshots import WeightSnapshotStore
from miles.backends.training_utils.train_model import TrainModel
from miles.guard.divergence import check_finite_weights
from miles.guard.fingerprint import combine_digests, digest_table, weights_are_finite
from miles.utils.errors import REPORT_BUG, MilesConfigError


class WeightExporter:
    """``keeps_snapshots``: a snapshot per pushed version (the SNAPSHOT denominator); ``keeps_engine_weights``:
    hold the engines' weights while the actor trains past them (--update-weights-interval > 1), for a save."""

    def __init__(self, model: TrainModel, keeps_snapshots: bool, keeps_engine_weights: bool) -> None:
        self.model = model
        self.version = 0  # pushes so far
        self.version_to_rollouts_trained: dict[int, int] = {}
        self.pushed_fingerprints: dict[int, str] = {}
        self.snapshots = WeightSnapshotStore() if keeps_snapshots else None
        self._keeps_engine_weights = keeps_engine_weights and not keeps_snapshots  # the snapshots hold them then
        self._engine_weights: tuple[int, dict] | None = None
        self._resume_push: tuple[int, dict | None] | None = None  # an exact resume's first push (``restore``)
        self.guard_s = 0.0  # the last export's finiteness check and fingerprint, reported with the next rollout

    @property
    def resuming(self) -> bool:
        """Whether the next push is an exact resume's re-push of the engines' saved version."""
        return self._resume_push is not None

    def push(self, rollouts_trained: int) -> dict:
        """``{"version", "fingerprint", "state_dict"}`` of the next push (an exact resume's first push: the saved
        version again). Non-finite weights raise ``DivergenceError`` and are never pushed."""
        if self._resume_push is not None:
            return self._push_again(*self._resume_push)
        return self._export(rollouts_trained)

    def _export(self, rollouts_trained: int) -> dict:
        self.version += 1
        state_dict = self.model.hf_state_dict()  # exactly what the engines load and fingerprint
        start = time.perf_counter()
        check_finite_weights(f"weight version {self.version} (after {rollouts_trained} rollouts)",
                             weights_are_finite(state_dict))
        digests = digest_table(state_dict)
        fingerprint = combine_digests(digests)
        self.guard_s = time.perf_counter() - start
        self.version_to_rollouts_trained[self.version] = rollouts_trained
        self.pushed_fingerprints[self.version] = fingerprint
        if self.snapshots is not None:
            native_state = self.model.module.state_dict()
            start = time.perf_counter()  # the guard's part: the hash of the snapshot's layout, where it is not HF's
            native_digests = digests if self.model.native_layout_is_hf else digest_table(native_state)
            self.guard_s += time.perf_counter() - start
            self.snapshots.add_pushed(self.version, native_state, digests, native_digests)
        elif self._keeps_engine_weights:
            self._engine_weights = (self.version, state_dict)
        return {"version": self.version, "fingerprint": fingerprint, "state_dict": state_dict}

    def _push_again(self, version: int, native_state: dict | None) -> dict:
        """Push saved ``version`` (``native_state``, or the live weights) under its own number and fingerprint."""
        self._resume_push, fingerprint = None, self.pushed_fingerprints[version]
        with self.model.swapped_weights(native_state) if native_state is not None else contextlib.nullcontext():
            pushed = self._export(self.version_to_rollouts_trained[version])
        if pushed["fingerprint"] != fingerprint:
            raise MilesConfigError(
                f"--load: the actor's weights hash to fingerprint {pushed['fingerprint'][:12]}, but weight version "
                f"{version} was pushed with {fingerprint[:12]}: the checkpoint was changed after it was saved. Load an "
                f"intact checkpoint, or start a new run from its weights (--hf-checkpoint) without --load.")
        return pushed

    def take_guard_seconds(self) -> float:
        """The guard's share of the last export, once (it is reported with the next rollout)."""
        seconds, self.guard_s = self.guard_s, 0.0
        return seconds

    # ---- checkpoints: what a save keeps, and the exact resume that restores it ----

    def saved_state(self, rollout_id: int) -> tuple[dict, dict[int, dict]]:
        """(the tables to save, HF weights of the pushed versions still live that are not the actor's own after
        training rollout ``rollout_id``: the engines', the snapshots), so a resume continues exactly."""
        live = {self.version, *(self.snapshots.versions() if self.snapshots is not None else ())}
        weights = {version: self._pushed_weights(version) for version in sorted(live)
                   if version > 0 and self.version_to_rollouts_trained.get(version) != rollout_id + 1}
        tables = {"weight_version": self.version, "saved_versions": sorted(weights),
                  "version_to_rollouts_trained": self.version_to_rollouts_trained,
                  "pushed_fingerprints": self.pushed_fingerprints}
        return tables, weights

    def _pushed_weights(self, version: int) -> dict:
        """HF weights of a pushed version that the live weights moved past (on every TP rank: it gathers)."""
        if self.snapshots is not None and version in self.snapshots.versions():
            return self.model.hf_state_dict(self.snapshots.get(version).state_dict)
        if self._engine_weights is not None and self._engine_weights[0] == version:
            return self._engine_weights[1]
        raise RuntimeError(f"the weights of pushed version {version} are no longer held. {REPORT_BUG}")

    def restore(self, state: dict, role_dir: Path, load_model: Callable[[str], TrainModel]) -> None:
        """The straight run's pushes as the save left them: the tables, the snapshots, and the version the engines
        held, to be pushed again under its own number (``push``). Saved weights (loaded by ``load_model(folder)``)
        are used only if they hash to the fingerprint recorded at their push."""
        self.version_to_rollouts_trained = dict(state["version_to_rollouts_trained"])
        self.pushed_fingerprints = dict(state["pushed_fingerprints"])
        saved = {version: self._load_version(role_dir, version, load_model) for version in state["saved_versions"]}
        engine_version = state["weight_version"]
        if self.snapshots is not None:  # the snapshots older than the engines' (they are saved with it, and only then)
            for version in sorted(v for v in saved if v != engine_version):
                self.snapshots.add_pushed(version, *saved[version])
        self.version = engine_version - 1
        self._resume_push = (engine_version, saved[engine_version][0] if engine_version in saved else None)

    def _load_version(self, role_dir: Path, version: int, load_model) -> tuple[dict, dict, dict | None]:
        """(native weights, HF digests, native digests) of a saved pushed version, checked against its fingerprint."""
        folder = checkpoint.version_dir(role_dir, version)
        model = load_model(str(folder))
        digests = digest_table(model.hf_state_dict())
        if combine_digests(digests) != self.pushed_fingerprints[version]:
            raise MilesConfigError(
                f"--load: {folder} holds weights with fingerprint {combine_digests(digests)[:12]}, but weight version "
                f"{version} was pushed with {self.pushed_fingerprints[version][:12]}: the checkpoint was changed after "
                f"it was saved. Load an intact checkpoint, or start a new run from its weights: --hf-checkpoint "
                f"{role_dir} without --load."
            )
        native = model.module.state_dict()
        return native, digests, digests if model.native_layout_is_hf else None
