"""Accepted upstream flags (docs/conformance.md, "Accepted upstream flags"): a flag whose only effect upstream is
where or how fast the same numbers are computed parses, is said once at startup (one line per group), and changes
no metric of a trained rollout, bit for bit, on either backend."""

import pytest

from miles.config.departures import load_refusals
from miles.utils.arguments import parse_args
from tests.fast.trainers import metrics_of_one_trained_rollout

# Every accepted flag with a value upstream allows, written out from upstream's parser (miles-rl 0.0.2 with its
# megatron-core): --attention-backend's AttnBackend, --transformer-impl's and --megatron-to-hf-mode's choices.
UPSTREAM_VALUES = {
    "--attention-backend": ["flash", "fused", "unfused", "local", "auto"],
    "--transformer-impl": ["local", "transformer_engine", "inference_optimized"],
    "--megatron-to-hf-mode": ["raw", "bridge"],
    "--no-gradient-accumulation-fusion": ["on"],
    "--optimizer-cpu-offload": ["on"],
    "--overlap-cpu-optimizer-d2h-h2d": ["on"],
}
EVERY_ACCEPTED = ["--attention-backend", "flash", "--transformer-impl", "transformer_engine",
                  "--no-gradient-accumulation-fusion", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
                  "--megatron-to-hf-mode", "bridge"]


def test_the_accepted_groups_hold_exactly_these_flags_with_every_upstream_value():
    accepted = {flag: list(row.accepts) for flag, row in load_refusals().items() if row.here}
    assert accepted == UPSTREAM_VALUES


def test_each_group_is_said_once_at_startup_and_sets_nothing_else():
    plain, launched = parse_args(argv=[]), parse_args(argv=EVERY_ACCEPTED)
    lines = [note for note in launched.notes if note.startswith("accepted upstream flags")]
    assert len(lines) == 3  # kernels and layers, optimizer offload, the conversion path
    assert lines[0].startswith("accepted upstream flags --attention-backend flash, --transformer-impl "
                               "transformer_engine, --no-gradient-accumulation-fusion: ")
    assert all("; here " in line and line.endswith(")") for line in lines)
    assert {k: v for k, v in vars(launched).items() if k != "notes"} == {
        k: v for k, v in vars(plain).items() if k != "notes"}


def test_a_value_upstream_does_not_allow_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_args(argv=["--attention-backend", "flsh"])
    assert stopped.value.code == 2 and "upstream flags miles refuses: --attention-backend flsh: " in capsys.readouterr().err


@pytest.mark.usefixtures("restore_torch_threads")
@pytest.mark.parametrize("backend", ["torch", "megatron"])
def test_a_rollout_trains_to_the_same_metrics_and_weights_with_and_without_them(embedded, backend):
    plain = metrics_of_one_trained_rollout(embedded, "--train-backend", backend)
    accepted = metrics_of_one_trained_rollout(embedded, "--train-backend", backend, *EVERY_ACCEPTED)
    assert accepted == plain  # bit for bit, the weights' fingerprint after the step included
