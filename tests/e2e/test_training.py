"""End-to-end runs of the real drivers on Ray with the embedded default: invariants of every mode."""

import asyncio
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import train
import train_async
from miles.backends.training_utils import checkpoint
from miles.tracking.metrics import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def run_async(args) -> list[dict]:
    asyncio.run(train_async.train(args))
    return read_metrics(args.log_dir)


def run_sync(args) -> list[dict]:
    train.train(args)
    return read_metrics(args.log_dir)


def staleness_reference(rollout_id: int, interval: int, start: int = 0) -> int:
    """d(k) of docs/design.md §2, written out independently of the code under test."""
    if rollout_id == start:
        return 0
    return rollout_id - max(start, interval * ((rollout_id - 1) // interval))


def column(records: list[dict], name: str) -> list:
    return [record[name] for record in records]


@pytest.mark.parametrize(("correction", "label"), [("--use-rollout-logprobs", "rollout_logprobs"), ("--use-tis", "tis"),
                                                   ("--keep-old-actor", "keep_old_actor")])
def test_async_ppo_runs_with_each_correction(make_args, correction, label):
    records = run_async(make_args("--advantage-estimator", "ppo", correction))
    assert column(records, "rollout_id") == [0, 1, 2, 3]
    assert column(records, "off_policy/staleness_max") == [0, 1, 1, 1]
    assert set(column(records, "off_policy/correction")) == {label}
    for record in records:
        assert math.isfinite(record["train/pg_loss"]) and math.isfinite(record["critic/value_loss"])


def test_async_grpo_runs_without_correction_and_draws_its_plots(make_args):
    args = make_args("--advantage-estimator", "grpo", "--save-plots")  # the e2e runs skip them otherwise
    records = run_async(args)
    assert column(records, "off_policy/staleness_max") == [0, 1, 1, 1]
    assert "critic/value_loss" not in records[0]
    plots = sorted(path.name for path in (Path(args.log_dir) / "plots").iterdir())
    assert {"rollout.png", "off_policy.png"} <= set(plots), plots
    assert all((Path(args.log_dir) / "plots" / name).stat().st_size > 0 for name in plots)


def test_sync_ppo_runs_without_correction_and_is_never_stale(make_args):
    records = run_sync(make_args("--advantage-estimator", "ppo"))
    assert column(records, "off_policy/staleness_max") == [0, 0, 0, 0]
    # Sync: the denominator is recomputed by the very weights that generated the rollout.
    assert max(column(records, "off_policy/denominator_behavior_abs_diff_max")) <= 1e-4


@pytest.mark.parametrize("estimator", ["gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_every_other_estimator_trains(make_args, embedded_cache, tmp_path, estimator):
    """Two rollouts change the weights: the checkpoint saved at the end differs from the initial weights in most
    tensors, and is finite."""
    save = tmp_path / "ckpt"
    records = run_sync(make_args("--advantage-estimator", estimator, "--normalize-advantages", "--num-rollout", "2",
                                 "--save", str(save)))
    assert len(records) == 2 and all(math.isfinite(r["train/loss"]) for r in records)
    initial = load_file(Path(embedded_cache.checkpoint_dir) / "model.safetensors")
    trained = load_file(checkpoint.rollout_dir(str(save), 1) / "actor" / "model.safetensors")
    assert trained.keys() == initial.keys()
    assert all(torch.isfinite(tensor).all() for tensor in trained.values())
    changed = [name for name in initial if not torch.equal(initial[name], trained[name])]
    assert len(changed) > len(initial) // 2, f"only {changed} of {len(initial)} tensors changed"


def test_uncorrected_async_grpo_denominator_drifts_from_the_engine(make_args):
    records = run_async(make_args("--advantage-estimator", "grpo", "--num-rollout", "6", "--lr", "1e-3"))
    stale = [r for r in records if r["off_policy/staleness_max"] >= 1]
    mean_diff = sum(column(stale, "train/train_rollout_logprob_abs_diff")) / len(stale)
    # At least 10x the bound --keep-old-actor holds to (tests/e2e/test_guard.py: <= 1e-4 at intervals 1, 2, 3).
    assert mean_diff >= 10 * 1e-4, mean_diff


@pytest.mark.parametrize("estimator, extra", [("grpo", []), ("ppo", ["--keep-old-actor"])], ids=["grpo", "ppo"])
def test_reward_clearly_goes_up(make_args, estimator, extra):
    """Default batch (16 prompts x 8 samples), 150 rollouts. Measured: grpo 0.11 -> 0.24, ppo 0.13 -> 0.32; the
    standard error of a 10-rollout mean is about 0.012, so a gain of 0.08 is far outside the noise."""
    args = make_args("--advantage-estimator", estimator, *extra, "--rollout-batch-size", "16",
                     "--n-samples-per-prompt", "8", "--num-rollout", "150")
    rewards = column(run_async(args), "rollout/reward_mean")
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last - first > 0.08, (first, last)


def test_sync_loop_options_colocate_eval_critic_only_and_debug_exit(make_args):
    args = make_args("--advantage-estimator", "ppo", "--colocate", "--eval-interval", "2",
                     "--num-critic-only-steps", "1", "--debug-exit-after-rollout", "2",
                     "--n-samples-per-eval-prompt", "2", "--eval-temperature", "0.5", "--eval-max-response-len", "1")
    records = run_sync(args)
    assert column(records, "rollout_id") == [0, 1, 2]  # stopped after rollout 2 of 4
    assert "train/pg_loss" not in records[0] and "critic/value_loss" in records[0]  # critic-only first rollout
    assert "train/pg_loss" in records[1]
    assert [("eval/accuracy" in record) for record in records] == [False, True, False]
    name, path = args.eval_prompt_data  # the embedded default's eval split, named "addition" by miles
    assert records[1][f"eval/{name}"] == records[1]["eval/accuracy"]  # one dataset: its mean reward is the total
    num_eval_prompts = len(Path(path).read_text().splitlines())
    assert records[1]["eval/num_samples"] == 2 * num_eval_prompts  # --n-samples-per-eval-prompt 2
    assert records[1]["eval/response_length_mean"] == 1  # --eval-max-response-len 1: every answer is cut at 1
    assert records[1]["rollout/response_length_mean"] > 1  # the training rollouts keep their 3


def test_num_epoch_sets_the_number_of_rollouts(make_args):
    # 80 embedded training prompts, 40 per rollout: one epoch is two rollouts.
    records = run_sync(make_args("--num-epoch", "1", "--rollout-batch-size", "40", "--n-samples-per-prompt", "2"))
    assert column(records, "rollout_id") == [0, 1]


def test_apply_chat_template_generates_from_the_rendered_prompts(make_args, embedded_cache, tmp_path):
    """A copy of the embedded checkpoint whose template prefixes "0+": the rollout's prompts and prompt tokens are
    the rendered ones, and the run trains (the embedded template itself renders a prompt as itself: fast tests)."""
    import shutil

    from miles.models.hf import load_tokenizer

    folder = tmp_path / "templated"
    shutil.copytree(embedded_cache.checkpoint_dir, folder)
    tokenizer = load_tokenizer(str(folder))
    tokenizer.chat_template = "0+{{ messages[0]['content'] }}"
    tokenizer.save_pretrained(folder)
    dump = tmp_path / "{rollout_id}.pt"
    args = make_args("--hf-checkpoint", str(folder), "--apply-chat-template", "--num-rollout", "3",
                     "--save-debug-rollout-data", str(dump))
    records = run_sync(args)
    assert column(records, "rollout_id") == [0, 1, 2]
    samples = torch.load(str(dump).format(rollout_id=2), weights_only=False)["samples"]
    for sample in samples:
        assert sample["prompt"].startswith("0+") and sample["prompt"].count("+") == 2
        prompt_ids = tokenizer(sample["prompt"])["input_ids"]
        assert sample["tokens"][: len(prompt_ids)] == prompt_ids


def test_the_custom_generate_example_and_its_eval_config_train_two_async_rollouts(make_args, tmp_path, monkeypatch):
    """examples/custom_generate.sh's function and eval config, as written (their paths from the repository root),
    under the async loop with --keep-old-actor: the function's samples carry the engine's log-probs and weight
    version, so the per-batch guard finds the snapshot of that version and checks its recomputed log-probs against
    the engine's within --keep-old-actor-tol, and accepts the stale rollout."""
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    debug = str(tmp_path / "debug" / "{rollout_id}.pt")
    args = make_args("--advantage-estimator", "grpo", "--keep-old-actor", "--num-rollout", "2",
                     "--eval-interval", "2", "--custom-generate-function-path",
                     "examples.custom_generate.generate.generate", "--eval-config",
                     "examples/custom_generate/eval.yaml", "--save-debug-rollout-data", debug)
    records = run_async(args)
    assert column(records, "rollout_id") == [0, 1] and column(records, "off_policy/staleness_max") == [0, 1]
    assert set(column(records, "off_policy/correction")) == {"keep_old_actor"}
    # the snapshot's recompute against the samples' log-probs: float32 rounding of the same 2-layer forward under
    # the same kept ids (the bound the sync test uses), where a fabricated log-prob would differ by O(1)
    assert max(column(records, "off_policy/denominator_behavior_abs_diff_max")) <= 1e-4
    assert all(0 <= record["rollout/reward_mean"] <= 1 for record in records)
    evaluated = records[1]
    assert {"eval/addition", "eval/addition-truncated_ratio", "eval/addition_cold",
            "eval/addition_cold-truncated_ratio"} <= set(evaluated) and "eval/addition" not in records[0]
    assert evaluated["eval/num_samples"] == 2 * 8 * 2  # two datasets of 8 prompts, n_samples_per_eval_prompt 2
    trained = torch.load(debug.format(rollout_id=0), weights_only=False)["samples"]
    # the function's top_k 8 acted on the training rollout: each response token kept at most 8 ids
    assert all(s["sampling_kept_ids"] and all(len(ids) <= 8 for ids in s["sampling_kept_ids"]) for s in trained)
    assert all(s["weight_versions"] == [1] for s in trained)
    evaluation = torch.load(debug.format(rollout_id="eval_1"), weights_only=False)["samples"]
    assert all(s["sampling_kept_ids"] is None for s in evaluation)  # evaluation sampled from the whole softmax
    assert max(s["response_length"] for s in evaluation[16:]) <= 2  # addition_cold's max_response_len


def test_async_grpo_with_dapo_dynamic_sampling_trains_on_groups_that_spread(make_args, tmp_path):
    """--over-sampling-batch-size with upstream's filter path: each rollout trains on 4 groups whose rewards are
    not all equal (read back from the debug dumps, not from the code under test), each sample stamped with the
    version the async schedule says: W_g(k) with g(k) = k - d(k) (staleness_reference), which is the push
    g(k) + 1 (docs/design.md §2: version 1 is the push before the loop)."""
    dumps = tmp_path / "dumps" / "rollout_{rollout_id}.pt"
    records = run_async(make_args(
        "--advantage-estimator", "grpo", "--num-rollout", "3", "--over-sampling-batch-size", "8",
        "--dynamic-sampling-filter-path", "miles.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
        "--save-debug-rollout-data", str(dumps)))
    assert column(records, "off_policy/staleness_max") == [0, 1, 1]
    assert column(records, "rollout/num_samples") == [16.0] * 3
    drops = []
    for record in records:
        rounds = record["rollout/dynamic_filter/rounds"]
        drops.append(sum(value for name, value in record.items() if name.startswith("rollout/dynamic_filter/drop_")))
        assert rounds >= 1 and drops[-1] <= rounds * 8 - 4  # 8 groups a round, 4 of them kept
    assert sum(drops) > 0, "the filter never dropped a group: the run did not exercise it"
    for rollout_id in range(3):
        samples = torch.load(str(dumps).format(rollout_id=rollout_id), weights_only=False)["samples"]
        groups = [samples[i : i + 4] for i in range(0, 16, 4)]
        assert all(len({s["reward"] for s in g}) > 1 for g in groups), [[s["reward"] for s in g] for g in groups]
        assert {v for s in samples for v in s["weight_versions"]} == {rollout_id - staleness_reference(rollout_id, 1) + 1}
