"""Generation time per rollout: SGLang (float32, CPU) vs miles' torch engine, on the embedded default and on a larger
random Qwen2 (hidden 512, 8 layers, the embedded tokenizer), in one run.

A rollout is the embedded run's: --prompts prompts x --samples samples, at most --max-response-len new tokens,
temperature 1. Each engine generates one warm-up rollout, then --repeats timed ones; the median is reported. The
torch engine runs with one torch thread (as in a run); SGLang with its own defaults. The last line is the SGLang /
torch ratio on the larger model.
Usage: python bench/engines.py [--prompts 16 --samples 8 --max-response-len 3 --repeats 5]
"""

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from miles.rollout.embedded import ensure_embedded_default
from miles.rollout.engine import TorchRolloutEngine
from miles.rollout.sglang_engine import SGLangRolloutEngine

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def random_qwen2(folder: str, embedded_dir: str) -> str:
    """A random Qwen2 (hidden 512, 8 layers, 8 heads) with the embedded tokenizer, saved as safetensors."""
    embedded = Qwen2Config.from_pretrained(embedded_dir)
    config = Qwen2Config(vocab_size=embedded.vocab_size, hidden_size=512, intermediate_size=1408,
                         num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                         max_position_embeddings=embedded.max_position_embeddings, tie_word_embeddings=True,
                         bos_token_id=embedded.bos_token_id, eos_token_id=embedded.eos_token_id,
                         pad_token_id=embedded.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (Path(embedded_dir) / name).exists():
            shutil.copy(Path(embedded_dir) / name, folder)
    return folder


def median_rollout_s(engine, prompts: list[dict], samples: int, max_len: int, repeats: int) -> float:
    engine.generate(prompts, samples, 1.0, max_len, 0)  # warm-up
    times = []
    for seed in range(repeats):
        start = time.perf_counter()
        engine.generate(prompts, samples, 1.0, max_len, seed + 1)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rollout_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """The embedded run's rollout (prompts x samples, response length) and the timed repeats (also bench/http_rollout.py)."""
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-response-len", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    rollout_shape_arguments(parser)
    options = parser.parse_args()
    embedded = ensure_embedded_default()
    lines = Path(embedded.train_jsonl).read_text().splitlines()[: options.prompts]
    prompts = [json.loads(line) for line in lines]
    shape = (prompts, options.samples, options.max_response_len, options.repeats)
    results = {}
    with tempfile.TemporaryDirectory(prefix="miles-bench-engines-") as folder:
        models = {"embedded (hidden 64, 2 layers)": embedded.checkpoint_dir,
                  "random Qwen2 (hidden 512, 8 layers)": random_qwen2(folder, embedded.checkpoint_dir)}
        for label, checkpoint in models.items():
            torch_s = median_rollout_s(TorchRolloutEngine(checkpoint, 0, 1), *shape)
            sglang = SGLangRolloutEngine(checkpoint, 0, {}, 0)
            try:
                sglang_s = median_rollout_s(sglang, *shape)
            finally:
                sglang.shutdown()
            results[label] = (torch_s, sglang_s)
    print(f"rollout: {options.prompts} prompts x {options.samples} samples, <= {options.max_response_len} tokens")
    print(f"{'model':<38}{'torch engine s':>16}{'SGLang s':>12}{'SGLang/torch':>14}")
    for label, (torch_s, sglang_s) in results.items():
        print(f"{label:<38}{torch_s:>16.4f}{sglang_s:>12.4f}{sglang_s / torch_s:>14.2f}")
    torch_s, sglang_s = results["random Qwen2 (hidden 512, 8 layers)"]
    print(f"SGLang/torch generation time per rollout, hidden 512 x 8 layers: {sglang_s / torch_s:.2f}")


if __name__ == "__main__":  # SGLang spawns its scheduler: the guard keeps the children from re-running main()
    main()
