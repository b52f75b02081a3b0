"""What activation recompute saves: the memory a training forward keeps for its backward pass, with and without.

On a random Qwen2 (``--layers`` layers, hidden ``--hidden``, ``--batch`` sequences of ``--length`` tokens), for
each backend and recompute setting, one training forward of the response log-probs: the bytes the process holds
after it (the autograd graph's saved activations, alive until the backward) minus the bytes before it, read from
glibc's allocator (``mallinfo2``: in-use heap plus mmapped blocks, every arena; torch's CPU tensors come from
malloc), then the backward, whose loss and gradients are compared with the plain step's (a first plain run, which
also warms the allocator up). The ratio is to the "none" row, a second plain run. One torch thread, so the bytes
do not depend on the machine's load; the seconds are printed for information only.

Usage: python bench/recompute_memory.py [--layers 8] [--hidden 256] [--length 256] [--batch 4]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from miles.backends import load_train_model  # noqa: E402
from miles.backends.training_utils.recompute import Recompute  # noqa: E402
from miles.utils.types import Sample  # noqa: E402


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                       "fsmblks", "uordblks", "fordblks", "keepcost")]


_LIBC = ctypes.CDLL("libc.so.6")
_LIBC.mallinfo2.restype = _MallInfo2


def bytes_in_use() -> int:
    info = _LIBC.mallinfo2()
    return info.uordblks + info.hblkhd  # allocated heap chunks + mmapped blocks (large tensors)


def settings(layers: int) -> dict[str, list[tuple[str, Recompute]]]:
    full = [("none", Recompute()), ("full uniform 1", Recompute("full", "uniform", 1)),
            (f"full block {layers // 2}", Recompute("full", "block", layers // 2))]
    return {"torch": full, "megatron": [*full, ("full uniform 2", Recompute("full", "uniform", 2)),
                                        ("selective core_attn", Recompute("selective"))]}


def measure(backend: str, folder: str, recompute: Recompute, samples: list[Sample]):
    model = load_train_model(backend, "actor", folder, seed=0, recompute=recompute)
    model.module.train()
    torch.manual_seed(0)
    start = time.perf_counter()
    before = bytes_in_use()
    log_probs, _ = model.response_log_probs(samples, 1.0)
    loss = sum(lp.sum() for lp in log_probs)
    held = bytes_in_use() - before
    loss.backward()
    seconds = time.perf_counter() - start
    grads = torch.cat([p.grad.flatten() for p in model.module.parameters() if p.grad is not None])
    return held, seconds, loss.item(), grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=args.length, tie_word_embeddings=True)
    tokens = torch.randint(3, 512, (args.batch, args.length)).tolist()
    samples = [Sample(group_index=i, index=i, prompt="", label="", tokens=row, response_length=args.length // 2)
               for i, row in enumerate(tokens)]
    with tempfile.TemporaryDirectory() as folder:
        Qwen2ForCausalLM(config).save_pretrained(folder)
        print(f"Qwen2 {args.layers} layers, hidden {args.hidden}, {args.batch} x {args.length} tokens, fp32")
        for backend, rows in settings(args.layers).items():
            _, _, base_loss, base_grads = measure(backend, folder, Recompute(), samples)  # warm-up and reference
            base_held = None
            for name, recompute in rows:
                held, seconds, loss, grads = measure(backend, folder, recompute, samples)
                base_held = base_held or held  # the "none" row, first: every ratio is to it
                diff = (grads - base_grads).abs().max().item() / base_grads.abs().max().item()
                print(f"{backend:9s} {name:20s} held after forward {held / 2**20:8.1f} MiB  ratio "
                      f"{held / base_held:5.3f}  fwd+bwd {seconds:5.2f} s  |dloss| {abs(loss - base_loss):.1e}  "
                      f"max|dgrad|/max|grad| {diff:.1e}")


if __name__ == "__main__":
    main()
