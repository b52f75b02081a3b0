"""Every --tis-mode x --tis-level, the rejection level, the veto, upstream's hooks and OPSM, end to end in async PPO.

One Ray session for the module (the conftest's), 3 rollouts of 4 prompts x 4 samples each, 2 optimizer steps per
rollout; tight bounds and lr 1e-3 so that the stale data crosses them and every choice really acts.
"""

import asyncio
import math
from pathlib import Path

import pytest

import train_async
from miles.tracking.metrics import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

FAST = ["--advantage-estimator", "ppo", "--num-rollout", "3", "--num-steps-per-rollout", "2", "--lr", "1e-3"]
TIGHT = ["--tis-clip-low", "0.98", "--tis-clip", "1.02"]


def run_async(make_args, *argv) -> list[dict]:
    args = make_args(*FAST, *argv)
    asyncio.run(train_async.train(args))
    records = read_metrics(args.log_dir)
    assert [r["rollout_id"] for r in records] == [0, 1, 2]
    assert all(math.isfinite(r["train/loss"]) for r in records)
    return records


def most(records: list[dict], key: str) -> float:
    return max(r[key] for r in records if key in r)


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode", ["truncate", "clip", "mask"])
def test_every_mode_and_level_trains_async_ppo(make_args, mode, level):
    bounds = TIGHT if mode != "truncate" else ["--tis-clip", "1.02"]
    records = run_async(make_args, "--use-tis", "--tis-mode", mode, "--tis-level", level, *bounds)
    assert {r["off_policy/correction"] for r in records} == {"tis"}
    assert most(records, "train/tis_clipfrac") > 0  # the bound acted on the stale rollouts
    if mode == "mask":
        assert most(records, "train/tis_masked_fraction") > 0
        assert most(records, "off_policy/tis_masked_token_fraction") > 0  # the pre-mask report agrees


def test_rejection_level_and_veto_drop_tokens(make_args):
    records = run_async(make_args, "--use-tis", "--rs-level", "geometric", "--rs-lower-bound", "0.999",
                        "--rs-upper-bound", "1.001", "--rs-veto-threshold", "0.9")
    assert most(records, "train/tis_masked_fraction") > 0
    assert most(records, "off_policy/tis_masked_sequence_fraction") > 0
    assert "off_policy/vetoed_sequence_fraction" in records[-1]


@pytest.mark.parametrize("builtin", ["icepop_function", "vanilla_tis_function"])
def test_upstream_builtin_hooks_train_async_ppo(make_args, builtin):
    records = run_async(make_args, "--use-tis", "--custom-tis-function-path",
                        f"miles.backends.training_utils.loss_hub.corrections.{builtin}", *TIGHT)
    assert most(records, "train/tis_clipfrac") > 0  # tokens outside the band got weight 0 (icepop) or the bound
    assert "off_policy/tis_masked_token_fraction" not in records[-1]  # a hook: no built-in fractions reported


@pytest.mark.parametrize("backend", ["megatron", "torch"])
def test_an_upstream_style_hook_with_its_config_file_trains_on_both_backends(make_args, backend):
    # examples/tis_hook/cp_tis.py: upstream's hook keywords, cp_utils, args.qkv_format, settings from the YAML file
    config = Path(__file__).resolve().parents[2] / "examples" / "tis_hook" / "cp_tis.yaml"
    records = run_async(make_args, "--train-backend", backend, "--use-tis", "--custom-config-path", str(config),
                        "--custom-tis-function-path", "examples.tis_hook.cp_tis.compute_tis_weights_with_cp")
    assert {r["off_policy/correction"] for r in records} == {"tis"}
    # the hook's own metrics reached the log: it weighted every trained batch (mean 1 per micro-batch by token,
    # tis_batch_normalize from the file; this metric averages per sample, so it is only near 1)
    assert all(0.5 < r["train/cp_tis_weight"] < 2.0 and "train/cp_tis_truncated" in r for r in records)


def test_opsm_masks_under_keep_old_actor(make_args):
    # with the behavior policy as denominator, κ = mean(old − current) > δ for some negative-advantage sequences
    records = run_async(make_args, "--keep-old-actor", "--use-opsm", "--opsm-delta", "1e-4")
    assert {r["off_policy/correction"] for r in records} == {"keep_old_actor"}
    assert most(records, "train/opsm_clipfrac") > 0
