"""The behavior-policy corrections, declared once (docs/design.md §3, docs/corrections.md).

Each row says what a correction is: its flag, where the PPO ratio's denominator ("old") comes from under it,
whether it needs the engine's log-probs, whether it satisfies the async contract and why, its label in the
``off_policy/correction`` metric and the plot panels that show it working. Every reader takes it from here: the
parser's flags and the contract's error (``miles.config.flags``, ``miles.config.arguments``), miles-check, the
conformance report, the trainer and its per-batch guard, the loss and the plots. Adding a row adds a correction
everywhere; its math is the one thing written elsewhere: a weight function under ``loss_hub/`` (named by the row's
``weights``), or a denominator source the trainer already has (the engine's log-probs, a snapshot, the current
actor). A run's rows are resolved once into an ``InEffect`` (``in_effect(args)``), which every reader asks.

Every TIS variant (--tis-mode, --tis-level, --rs-*, --custom-tis-function-path) acts only under --use-tis, so it is
the TIS row. OPSM is not a row: it masks by the mean (old − current) log ratio, whose "old" is the denominator some
row chose, the current actor's when none did, so alone it measures 0 staleness and corrects nothing.

Imports nothing but configuration's errors: the parser reads it before torch or Ray are imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from miles.config.errors import MilesConfigError

# Where the ratio's denominator comes from, in the order that decides it when several rows are chosen: the engine's
# log-probs replace any recompute; a snapshot's recompute replaces the current actor's.
ROLLOUT, SNAPSHOT, CURRENT = "rollout", "snapshot", "current"
DENOMINATOR_ORDER = (ROLLOUT, SNAPSHOT, CURRENT)
NO_CORRECTION = "none"  # the label of a run with no row chosen

LOSS_HUB = "miles.backends.training_utils.loss_hub"  # where the rows' weight functions live

# How --use-tis bounds and aggregates its weight (flags.add_tis_variant_arguments, loss_hub/tis.py).
TIS_MODES = ("truncate", "clip", "mask")
TIS_LEVELS = ("token", "sequence", "geometric")


@dataclass(frozen=True)
class Correction:
    label: str  # in off_policy/correction and the plots; also the row's name
    dest: str  # the attribute on ``args``; the flag is its kebab-case form
    denominator: str  # ROLLOUT, SNAPSHOT or CURRENT: where "old" comes from when this row decides it
    needs_rollout_log_probs: bool  # the guard checks every sample carries one finite engine log-prob per token
    satisfies_contract: bool  # counts as the behavior-policy correction train_async.py requires of PPO
    does: str  # one clause, for the contract's error and --help
    why: str  # why it does (or does not) satisfy the contract
    panels: tuple[str, ...]  # the off_policy/* metrics its plot page shows first, most telling first
    help_tail: str = ""  # what --help adds after ``does``
    # "package.module.function" with upstream's TIS-hook signature (loss_hub/corrections.py): it re-weights and masks
    # the per-token policy loss and returns per-token metrics. None: the row acts through its denominator alone.
    weights: str | None = None
    weights_flag: str | None = None  # the dest of a flag whose dotted path, when given, replaces ``weights``

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")


_DRIFT = ("policy_behavior_kl", "kl_k3", "chi2_token", "chi2_sequence", "log_ppl_diff", "ess")
_DROPS = ("tis_masked_token_fraction", "tis_masked_sequence_fraction", "vetoed_sequence_fraction")

CORRECTIONS: tuple[Correction, ...] = (
    Correction(
        label="rollout_logprobs", dest="use_rollout_logprobs", denominator=ROLLOUT, needs_rollout_log_probs=True,
        satisfies_contract=True,
        does="the rollout engine's log-probs become the PPO ratio denominator",
        why="the denominator is the behavior policy's own log-prob, exactly; it carries any train/inference "
            "numeric mismatch into the ratio",
        panels=("policy_behavior_kl", "policy_behavior_abs_diff", "kl_k3", "chi2_token", "chi2_sequence",
                "log_ppl_diff", "ess", "staleness_max"),
        help_tail=" (skips the recompute pass). Excludes --use-tis.",
    ),
    Correction(
        label="tis", dest="use_tis", denominator=CURRENT, needs_rollout_log_probs=True, satisfies_contract=True,
        does="truncated importance sampling re-weights the loss by pi_old/pi_rollout, capped at --tis-clip",
        why="the weight pi_old/pi_rollout carries the loss from the current actor back to the behavior policy",
        panels=("tis_raw_std", "tis_clip_fraction", *_DROPS, *_DRIFT, "staleness_max"),
        help_tail=" (and from below at --tis-clip-low), per token; --tis-mode and --tis-level choose a variant.",
        weights=f"{LOSS_HUB}.corrections.configured_tis_function", weights_flag="custom_tis_function_path",
    ),
    Correction(
        label="keep_old_actor", dest="keep_old_actor", denominator=SNAPSHOT, needs_rollout_log_probs=False,
        satisfies_contract=True,
        does="the denominator is recomputed with the weights the rollout engines used",
        why="a snapshot per pushed weight version, looked up by the samples' version and fingerprint, is the "
            "behavior policy's weights, for every --update-weights-interval",
        # old = behavior, so old-vs-rollout divergences are float32 rounding; the drift is the policy's
        panels=("denominator_behavior_abs_diff_max", "num_snapshots", "policy_behavior_kl",
                "policy_behavior_abs_diff", "staleness_max"),
        help_tail=" (a snapshot per pushed weight version).",
    ),
)
NO_CORRECTION_PANELS = ("denominator_behavior_kl", *_DRIFT, "tis_raw_std", "staleness_max")
SUGGESTED_FIRST = "keep_old_actor"  # for PPO: exact for every interval, the one miles-check's fix names first
SUGGESTED_FIRST_CRITIC_FREE = "tis"  # for GRPO and the like: no recompute pass to replace, a weight on the loss

# --get-mismatch-metrics with no chosen row that weights the loss runs this row's weight function for its metrics
# only, its weights not applied (upstream computes the TIS metrics the same way).
METRICS_ONLY_ROW = "tis"

# Pairs that exclude each other, with the reason (upstream's rule).
EXCLUSIVE = {("rollout_logprobs", "tis"): "with the rollout log-probs as denominator the TIS weight "
                                          "pi_old/pi_rollout is 1 by construction"}


def correction(label: str) -> Correction:
    rows = {row.label: row for row in CORRECTIONS}
    if label not in rows:
        raise KeyError(f"no correction labelled {label!r}; the table has {', '.join(rows)}")
    return rows[label]


def contract_corrections() -> tuple[Correction, ...]:
    return tuple(row for row in CORRECTIONS if row.satisfies_contract)


def chosen(args) -> tuple[Correction, ...]:
    """The rows whose flag is set on ``args`` (reads exactly the table's ``dest`` attributes)."""
    return tuple(row for row in CORRECTIONS if getattr(args, row.dest))


def satisfies_contract(labels: Sequence[str]) -> bool:
    return any(correction(label).satisfies_contract for label in labels)


def exclusion_error(labels: Sequence[str]) -> str | None:
    """The message for two chosen rows that exclude each other, else None."""
    for (first, second), reason in EXCLUSIVE.items():
        if first in labels and second in labels:
            return (f"{correction(first).flag} and {correction(second).flag} are both set, but they exclude each "
                    f"other: {reason}. Keep one of them.")
    return None


@dataclass(frozen=True)
class InEffect:
    """The rows a run chose, resolved once: where "old" comes from, what re-weights the loss, the label.

    Built by ``in_effect(args)`` in every process that needs it (the parser, the trainer, the loss, the driver's
    checkpoints, miles-check), so none of them reads a correction flag by name. Two rows that exclude each other
    are refused here (``MilesConfigError``), the one place the rule is checked.
    """

    labels: tuple[str, ...] = ()  # the chosen rows, in the table's order
    weight_functions: tuple[str, ...] = ()  # dotted paths applied to the policy loss, in the table's order

    def __post_init__(self) -> None:
        exclusion = exclusion_error(self.labels)
        if exclusion is not None:
            raise MilesConfigError(exclusion)

    @property
    def denominator(self) -> str:
        """Where "old" comes from for these rows together (CURRENT when none replaces the recompute)."""
        sources = {correction(label).denominator for label in self.labels}
        return next(source for source in DENOMINATOR_ORDER if source in sources or source == CURRENT)

    @property
    def keeps_snapshots(self) -> bool:
        """Whether a weight snapshot is kept per pushed version (a row whose denominator is SNAPSHOT)."""
        return any(correction(label).denominator == SNAPSHOT for label in self.labels)

    @property
    def needs_rollout_log_probs(self) -> bool:
        return any(correction(label).needs_rollout_log_probs for label in self.labels)

    @property
    def satisfies_contract(self) -> bool:
        return satisfies_contract(self.labels)

    @property
    def label(self) -> str:
        """A short label of the denominator and re-weighting actually used, e.g. ``keep_old_actor+tis``.

        The row that decides the denominator comes first; a row that would supply a denominator but does not (a
        snapshot under the rollout log-probs) is marked ``(metrics)``, since it then only feeds the mismatch
        metrics."""
        if not self.labels:
            return NO_CORRECTION
        source = self.denominator
        rows = sorted(map(correction, self.labels), key=lambda row: DENOMINATOR_ORDER.index(row.denominator))
        return "+".join(row.label + ("(metrics)" if row.denominator not in (source, CURRENT) else "") for row in rows)


def in_effect(args) -> InEffect:
    """The rows chosen on ``args``; a row's ``weights_flag``, when set, replaces its weight function (a namespace
    without that flag, such as a test's, has no replacement)."""
    rows = chosen(args)
    weights = tuple((getattr(args, row.weights_flag, None) if row.weights_flag else None) or row.weights
                    for row in rows if row.weights is not None)
    return InEffect(tuple(row.label for row in rows), weights)


def metrics_only_function() -> str:
    """The weight function --get-mismatch-metrics runs for its metrics when no chosen row weights the loss."""
    return correction(METRICS_ONLY_ROW).weights


def plot_panels(label: str | None) -> tuple[str, ...]:
    """The panels of a run labelled ``label`` (its first word decides; an unknown or missing one: no correction)."""
    first = (label or NO_CORRECTION).split("+")[0].removesuffix("(metrics)")
    rows = {row.label: row for row in CORRECTIONS}
    return rows[first].panels if first in rows else NO_CORRECTION_PANELS


def contract_choices() -> str:
    """The contract's list of corrections, one line each: flag, then what it does."""
    rows = contract_corrections()
    width = max(len(row.flag) for row in rows)
    return ";\n".join(f"  {row.flag:<{width}}  {row.does}" for row in rows) + "."


def suggested_fix(first: str = SUGGESTED_FIRST) -> str:
    """The contract's corrections as one suggestion: ``first`` first, the others in parentheses."""
    flags = [row.flag for row in contract_corrections()]
    flags.sort(key=lambda flag: flag != correction(first).flag)  # stable: the others keep the table's order
    return flags[0] + (f" (or {', or '.join(flags[1:])})" if flags[1:] else "")


def combination_note(args) -> str | None:
    """What a combination of corrections means (docs/design.md §3), said once at startup so nobody has to guess."""
    labels = in_effect(args).labels
    if "keep_old_actor" in labels and "rollout_logprobs" in labels:
        return ("--use-rollout-logprobs with --keep-old-actor: the rollout engine's log-probs are the PPO ratio "
                "denominator; the snapshots only feed the denominator-vs-behavior metrics.")
    if "keep_old_actor" in labels and "tis" in labels:
        return ("--use-tis with --keep-old-actor: the snapshot's log-probs are the denominator, so TIS corrects only "
                "the train/inference numeric mismatch (weights close to 1 on the torch engine).")
    return None
