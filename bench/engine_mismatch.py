"""The train/inference mismatch, measured: SGLang in float32 and in bfloat16 against the trainer, on the same weights,
sampling from the whole softmax and under top-p 0.9 / top-k 20 with truncated and with full (upstream's) log-probs.

Each SGLang engine (one at a time, in this process) samples --prompts prompts x --samples responses from the
embedded checkpoint at temperature 1; the trainer's log-probs of exactly those tokens come from one float32
transformers forward pass of the same weights: log softmax(logits / T), under the engine's kept set when the engine
kept one (truncated), and for "full" the log-prob of the distribution actually sampled (renormalized over the kept
set the trainer's own logits give): the engine's whole-softmax log-prob is then off by the kept mass. The per-token comparison is the guard's
own report (``miles.backends.training_utils.loss_hub.mismatch.denominator_vs_behavior``, old = trainer, roll = SGLang): |old - roll| mean and
max, the k3 estimate of KL(roll || trainer), the ESS ratio of w = exp(old - roll) and the fraction of w outside
[--tis-clip-low, --tis-clip] = [0, 2]. The last line is the bf16/fp32 ratio of the max abs diff.
Usage: python bench/engine_mismatch.py [--prompts 32 --samples 8] (prints a markdown table)
"""

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from miles.backends.training_utils.loss_hub.mismatch import denominator_vs_behavior
from miles.rollout.embedded import ensure_embedded_default
from miles.rollout.sampling import SamplingOptions, kept_mask, kept_tokens, renormalized_log_probs
from miles.rollout.sglang_engine import SGLangRolloutEngine

COLUMNS = ("denominator_behavior_abs_diff_mean", "denominator_behavior_abs_diff_max", "denominator_behavior_kl",
           "ess", "tis_clip_fraction")


SAMPLINGS = {"whole softmax": {}, "top-p 0.9 top-k 20, truncated": {"top_p": 0.9, "top_k": 20},
             "top-p 0.9 top-k 20, full": {"top_p": 0.9, "top_k": 20, "logprobs": "full"}}


def trainer_log_probs(model, samples, temperature: float, sampling: dict) -> list[torch.Tensor]:
    """The behavior log-prob of each response token by the trainer, one float32 forward pass per sample: under the
    sample's kept ids if it has them, else under the kept set of the trainer's logits if ``sampling`` truncates."""
    options, out = SamplingOptions(**sampling), []
    with torch.no_grad():
        for sample in samples:
            ids = torch.tensor([sample.tokens])
            prompt_len = len(sample.tokens) - sample.response_length
            log_probs = torch.log_softmax(model(input_ids=ids).logits[0, prompt_len - 1:-1].float() / temperature,
                                          dim=-1)  # (R, V)
            if sample.sampling_kept_ids is not None:
                log_probs = renormalized_log_probs(log_probs, kept_mask(sample.sampling_kept_ids, log_probs.shape[-1]))
            elif options.truncates:
                log_probs = renormalized_log_probs(
                    log_probs, kept_tokens(log_probs, options.top_p, options.top_k, options.min_p))
            out.append(log_probs.gather(1, ids[0, prompt_len:, None]).squeeze(1))
    return out


def mismatch(dtype: str, checkpoint: str, prompts: list[dict], samples: int, model) -> dict[str, dict[str, float]]:
    engine = SGLangRolloutEngine(checkpoint, 0, {"dtype": dtype}, 0)
    reports = {}
    try:
        for name, sampling in SAMPLINGS.items():
            generated = engine.generate(prompts, samples, 1.0, 3, 0, sampling)
            rollout = [torch.tensor(sample.rollout_log_probs) for sample in generated]
            reports[name] = denominator_vs_behavior(trainer_log_probs(model, generated, 1.0, sampling), rollout,
                                                    tis_clip=2.0, tis_clip_low=0.0)
    finally:
        engine.shutdown()
    return reports


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
    print(f"| engine | sampling | " + " | ".join(name.replace("denominator_behavior_", "") for name in COLUMNS)
          + " | tokens |")
    print("|---|---|" + "---|" * (len(COLUMNS) + 1))
    for dtype, reports in results.items():
        for sampling, report in reports.items():
            print(f"| SGLang {dtype} | {sampling} | " + " | ".join(f"{report[name]:.3g}" for name in COLUMNS)
                  + f" | {int(report['num_tokens'])} |")
    for sampling in SAMPLINGS:
        ratio = results["bfloat16"][sampling]["denominator_behavior_abs_diff_max"] / max(
            results["float32"][sampling]["denominator_behavior_abs_diff_max"], 1e-12)
        print(f"bf16/fp32 max |log-prob diff| ratio, {sampling}: {ratio:.3g}")


if __name__ == "__main__":  # SGLang spawns its scheduler: the guard keeps the children from re-running main()
    main()
