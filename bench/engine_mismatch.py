"""The train/inference mismatch, measured: SGLang in float32 and in bfloat16 against the trainer, on the same weights.

Each SGLang engine (one at a time, in this process) samples --prompts prompts x --samples responses from the
embedded checkpoint at temperature 1; the trainer's log-probs of exactly those tokens come from one float32
transformers forward pass of the same weights (log softmax(logits / T)). The per-token comparison is the guard's
own report (``miles.guard.off_policy.denominator_vs_behavior``, old = trainer, roll = SGLang): |old - roll| mean and
max, the k3 estimate of KL(roll || trainer), the ESS ratio of w = exp(old - roll) and the fraction of w outside
[--tis-clip-low, --tis-clip] = [0, 2]. The last line is the bf16/fp32 ratio of the max abs diff.
Usage: python bench/engine_mismatch.py [--prompts 32 --samples 8]
"""

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from miles.guard.off_policy import denominator_vs_behavior
from miles.rollout.embedded import ensure_embedded_default
from miles.rollout.sglang_engine import SGLangRolloutEngine

COLUMNS = ("denominator_behavior_abs_diff_mean", "denominator_behavior_abs_diff_max", "denominator_behavior_kl",
           "ess", "tis_clip_fraction")


def trainer_log_probs(model, samples, temperature: float) -> list[torch.Tensor]:
    """log softmax(logits / T)[token] of each response token, one forward pass per sample (float32)."""
    out = []
    with torch.no_grad():
        for sample in samples:
            ids = torch.tensor([sample.tokens])
            prompt_len = len(sample.tokens) - sample.response_length
            logits = model(input_ids=ids).logits[0, prompt_len - 1:-1].float() / temperature  # (R, V)
            out.append(torch.log_softmax(logits, dim=-1).gather(1, ids[0, prompt_len:, None]).squeeze(1))
    return out


def mismatch(dtype: str, checkpoint: str, prompts: list[dict], samples: int, model) -> dict[str, float]:
    engine = SGLangRolloutEngine(checkpoint, 0, {"dtype": dtype}, 0)
    try:
        generated = engine.generate(prompts, samples, 1.0, 3, 0)
    finally:
        engine.shutdown()
    rollout = [torch.tensor(sample.rollout_log_probs) for sample in generated]
    return denominator_vs_behavior(trainer_log_probs(model, generated, 1.0), rollout, tis_clip=2.0, tis_clip_low=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    options = parser.parse_args()
    embedded = ensure_embedded_default()
    lines = Path(embedded.train_jsonl).read_text().splitlines()[: options.prompts]
    prompts = [json.loads(line) for line in lines]
    model = AutoModelForCausalLM.from_pretrained(embedded.checkpoint_dir, dtype=torch.float32).eval()
    results = {dtype: mismatch(dtype, embedded.checkpoint_dir, prompts, options.samples, model)
               for dtype in ("float32", "bfloat16")}
    print(f"{'engine':<16}" + "".join(f"{name.replace('denominator_behavior_', ''):>18}" for name in COLUMNS)
          + f"{'tokens':>8}")
    for dtype, report in results.items():
        print(f"{'SGLang ' + dtype:<16}" + "".join(f"{report[name]:>18.3g}" for name in COLUMNS)
              + f"{int(report['num_tokens']):>8}")
    ratio = results["bfloat16"]["denominator_behavior_abs_diff_max"] / max(
        results["float32"]["denominator_behavior_abs_diff_max"], 1e-12)
    print(f"bf16/fp32 max |log-prob diff| ratio: {ratio:.3g}")


if __name__ == "__main__":  # SGLang spawns its scheduler: the guard keeps the children from re-running main()
    main()
