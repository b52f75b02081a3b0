"""What the runtime guard costs: every check timed, as a fraction of the actor's step, and the fingerprint at scale.

1. On the embedded default (16 prompts x 8 samples, the default flags), in this process with the real
   ``PolicyTrainer`` and ``TorchRolloutEngine`` (no Ray, so the timings are the actor's own): per mode, a warm-up
   of ``--warmup`` rollouts, then ``--repeats`` rollouts of generate -> prepare -> train -> export -> engine load.
   Every function of the guard is wrapped with a timer where the trainer calls it: the provenance checks, the
   per-batch contract, the push's finiteness check and fingerprint (hash per tensor and their combination), the
   snapshot's recomputed fingerprint, the snapshot count, the denominator comparison ``denominator_abs_diff``
   (what ``check_denominator_tolerance`` reads) and that check; and the actor's own ``perf/guard_s`` (the same
   checks, with the snapshot's conversion to the HF layout). Prints the median per check and per rollout, and the
   guard (the larger of the two) as a fraction of the actor's step per rollout (prepare + train + export) and of
   ``train`` alone (the optimizer steps); the goal is <= 2 % of the actor's step.
2. The fingerprint and the finiteness check on ``--large-params`` float32 parameters (default 1e9, 4 GB), made
   and hashed ``--chunk-params`` at a time so that memory stays bounded; SHA-256 and a float64 sum (the first
   fingerprint) of the same chunks for comparison.

Usage: python bench/guard_cost.py [--warmup 3] [--repeats 20] [--large-params 1e9] [--chunk-params 5e7]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

import miles.backends.train_process as train_process  # noqa: E402
from miles.backends.training_utils import snapshots, weight_export  # noqa: E402
from miles.guard import fingerprint, off_policy  # noqa: E402
from miles.rollout.data_source import load_prompt_data  # noqa: E402
from miles.rollout.embedded import ensure_embedded_default  # noqa: E402
from miles.rollout.engine import TorchRolloutEngine  # noqa: E402
from miles.utils.arguments import parse_args  # noqa: E402
from miles.utils.types import RolloutBatch  # noqa: E402

MODES = {"ppo --keep-old-actor": ["--advantage-estimator", "ppo", "--keep-old-actor"],
         "ppo --use-tis": ["--advantage-estimator", "ppo", "--use-tis"],
         "grpo --use-rollout-logprobs": ["--advantage-estimator", "grpo", "--use-rollout-logprobs"]}
# Where the trainer looks each guard function up (module, name): wrapping it there times every call.
GUARD_FUNCTIONS = [(off_policy, name) for name in (
    "check_one_version_per_sample", "sample_staleness", "check_staleness", "check_engine_loaded_pushed_weights",
    "check_rollout_log_probs", "check_correction_per_batch", "check_snapshot_provenance", "check_snapshot_count",
    "denominator_abs_diff", "check_denominator_tolerance")] + [(weight_export, name) for name in (
    "weights_are_finite", "check_finite_weights", "digest_table", "combine_digests")] + [(snapshots, name) for name in (
    "digest_table", "combine_digests", "differing_tensors")]


@contextlib.contextmanager
def timed_guard(times: dict[str, float]):
    """Replace each guard function by a wrapper adding its wall time to ``times[name]``; restore them after."""
    originals = [(module, name, getattr(module, name)) for module, name in GUARD_FUNCTIONS]

    def timer(name, function):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                times[name] += time.perf_counter() - start
        return wrapper

    for module, name, function in originals:
        setattr(module, name, timer(name, function))
    try:
        yield
    finally:
        for module, name, function in originals:
            setattr(module, name, function)


def time_mode(flags: list[str], warmup: int, repeats: int) -> dict[str, float]:
    """Median seconds per rollout of each guard function and of their sum ("guard functions"), of the guard as the
    actor measures it (``perf/guard_s``: the same checks, with the snapshot's conversion to the HF layout), of
    ``train`` (the optimizer steps) and of the actor's step (prepare + train + export)."""
    embedded = ensure_embedded_default()
    args = parse_args(argv=[*flags, "--hf-checkpoint", embedded.checkpoint_dir])
    prompts = load_prompt_data(embedded.train_jsonl, args.input_key, args.label_key)
    trainer = train_process.PolicyTrainer(args, num_threads=1)
    trainer.init()
    engine = TorchRolloutEngine(args.hf_checkpoint, seed=0, num_threads=1)
    per_rollout = defaultdict(list)
    with timed_guard(times := defaultdict(float)):
        payload = trainer.export_weights(rollouts_trained=0)
        engine.load_weights(payload["state_dict"], payload["version"])
        times.clear()  # the start-up push is no rollout's
        for k in range(warmup + repeats):
            batch = prompts[(k * args.rollout_batch_size) % len(prompts):][: args.rollout_batch_size]
            samples = engine.generate(batch, args.n_samples_per_prompt, args.rollout_temperature,
                                      args.rollout_max_response_len, seed=k)
            for sample in samples:
                sample.reward = float(sample.index % 2)
            values = [torch.zeros(s.response_length) for s in samples] if args.use_critic else None
            start = time.perf_counter()
            guard_s = trainer.prepare(k, RolloutBatch(k, samples), 0, values)["perf/guard_s"]  # with the last push's
            prepared = time.perf_counter()
            trainer.train(k)
            trained = time.perf_counter()
            payload = trainer.export_weights(rollouts_trained=k + 1, after_training=True)
            exported = time.perf_counter()
            engine.load_weights(payload["state_dict"], payload["version"])
            if k >= warmup:
                per_rollout["train"].append(trained - prepared)
                per_rollout["actor step"].append(exported - start)
                per_rollout["perf/guard_s"].append(guard_s)
                for name in [name for _, name in GUARD_FUNCTIONS]:
                    per_rollout[name].append(times[name])
                per_rollout["guard functions"].append(sum(times.values()))
            times.clear()
    return {name: statistics.median(values) for name, values in per_rollout.items()}


def large_fingerprint(num_params: int, chunk_params: int) -> dict[str, float]:
    """Seconds to hash (the fingerprint's XXH3-128, and SHA-256 for comparison), to check the finiteness of, and to sum
    (float64) ``num_params`` float32 values."""
    seconds = defaultdict(float)
    generator = torch.Generator().manual_seed(0)
    table = {}
    for index, start in enumerate(range(0, num_params, chunk_params)):
        tensor = torch.randn(min(chunk_params, num_params - start), generator=generator)
        for name, work in (("XXH3-128 per tensor (tensor_digest)",
                            lambda: table.__setitem__(f"t{index}", fingerprint.tensor_digest(tensor))),
                           ("SHA-256 of the same bytes (the alternative)",
                            lambda: hashlib.sha256(tensor.numpy().data).hexdigest()),
                           ("finiteness check", lambda: fingerprint.weights_are_finite({"t": tensor})),
                           ("float64 sum (the first fingerprint)", lambda: float(tensor.double().sum()))):
            begin = time.perf_counter()
            work()
            seconds[name] += time.perf_counter() - begin
    begin = time.perf_counter()
    fingerprint.combine_digests(table)
    seconds["combine"] = time.perf_counter() - begin
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--large-params", type=float, default=1e9, help="0 skips part 2")
    parser.add_argument("--chunk-params", type=float, default=5e7)
    options = parser.parse_args()
    torch.set_num_threads(1)  # one thread per process, as the actor and the engine run
    fractions = {}
    summary = ("train", "actor step", "perf/guard_s", "guard functions")
    for mode, flags in MODES.items():
        medians = time_mode(flags, options.warmup, options.repeats)
        guard = max(medians["perf/guard_s"], medians["guard functions"])
        fractions[mode] = guard / medians["actor step"]
        print(f"{mode}: median per rollout over {options.repeats} (after {options.warmup} warm-up)", flush=True)
        for name, value in sorted(medians.items(), key=lambda item: -item[1]):
            if value > 0 and name not in summary:
                print(f"  {name:36s} {value * 1e3:8.3f} ms")
        print(f"  guard: {medians['guard functions'] * 1e3:.3f} ms in its functions, {medians['perf/guard_s'] * 1e3:.3f} "
              f"ms as the actor measures it (perf/guard_s); train {medians['train'] * 1e3:.1f} ms, actor step "
              f"(prepare + train + export) {medians['actor step'] * 1e3:.1f} ms -> {100 * fractions[mode]:.2f} % of "
              f"the actor's step, {100 * guard / medians['train']:.2f} % of train", flush=True)
    if options.large_params:
        num_params, chunk = int(options.large_params), int(options.chunk_params)
        seconds = large_fingerprint(num_params, chunk)
        gigabytes = 4 * num_params / 1e9
        print(f"fingerprint of {num_params:.3g} float32 parameters ({gigabytes:.1f} GB) in tensors of {chunk:.3g}, "
              "one thread:")
        for name, value in seconds.items():
            rate = "" if name == "combine" else f" ({gigabytes / value if value else float('inf'):.2f} GB/s)"
            print(f"  {name:44s} {value:8.2f} s{rate}")
    worst = max(fractions, key=fractions.get)
    print(f"runtime guard costs at most {100 * fractions[worst]:.2f} % of the actor's step per rollout ({worst}; "
          "goal <= 2 %)")


if __name__ == "__main__":
    main()
