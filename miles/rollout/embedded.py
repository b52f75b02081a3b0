"""The embedded default: a tiny Qwen2 model that adds two digits, built locally and cached. No network, ever.

What gets built (docs/design.md §5), once per cache folder:

- a character tokenizer made with ``tokenizers``: vocabulary ``<pad> <bos> <eos> 0-9 + =`` (15 tokens), one token
  per character, ``<bos>`` prepended; saved as a ``PreTrainedTokenizerFast`` folder (reload it with
  ``PreTrainedTokenizerFast.from_pretrained``: ``AutoTokenizer`` would swap in Qwen2's pre-tokenizer);
- a Qwen2 causal LM (hidden 64, 2 layers, 4 heads, MLP 256, tied embeddings, fp32, ~133k parameters) saved with
  safetensors through ``save_pretrained``;
- the task: prompt ``a+b=`` for single digits a, b (prompt tokens ``<bos> a + b =``), label ``str(a + b)``, the
  answer is the label's digits then ``<eos>``. The 100 pairs are split deterministically into 80 train and 20
  held-out eval prompts, written as upstream-format JSONL (``{"prompt": "3+4=", "label": "7"}``);
- the start checkpoint: a short supervised warm-up (50 Adam steps, lr 1e-3, batch 64, fixed seed) on the train
  split. It stops on purpose at ~10 % sampled accuracy: from random weights GRPO does not learn usefully, and ~100
  steps solve the task, leaving RL nothing to show.

The cache is written atomically: everything is built in a temporary sibling folder and moved into place with
one ``os.replace``, so a crash or a concurrent build never leaves a half-built cache behind.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from miles.models.hf import quiet_transformers_progress
from miles.utils.errors import MilesConfigError

CACHE_VERSION = "embedded-v2"  # v2: the tokenizer has a chat template (CHAT_TEMPLATE); the model is v1's  # bump when anything below changes, so stale caches are never reused
CACHE_ENV_VAR = "MILES_CACHE_DIR"
MANIFEST_NAME = "manifest.json"  # written last inside the build folder: its presence marks a complete build

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
VOCAB = SPECIAL_TOKENS + tuple("0123456789+=")
NUM_EVAL_PROMPTS = 20
SPLIT_SEED = 0

SFT_STEPS = 50  # ~11 % sampled accuracy with this init and split (40 steps give ~7 %, 70 give ~19 %)
SFT_BATCH_SIZE = 64
SFT_LR = 1e-3
SFT_SEED = 0

_STALE_BUILD_SECONDS = 3600  # a build takes seconds; a temporary folder this old belongs to a crashed build


@dataclass(frozen=True)
class EmbeddedPaths:
    checkpoint_dir: str  # HF folder: config.json, model.safetensors, tokenizer files
    train_jsonl: str
    eval_jsonl: str


def default_cache_root() -> Path:
    """``$MILES_CACHE_DIR`` if set, else ``~/.cache/miles``; the embedded default lives in ``<root>/embedded-v2``."""
    from_env = os.environ.get(CACHE_ENV_VAR)
    return Path(from_env).expanduser() if from_env else Path.home() / ".cache" / "miles"


def ensure_embedded_default(cache_dir: str | None = None) -> EmbeddedPaths:
    """Return the embedded default's paths, building it first if ``<cache_dir>/embedded-v2`` is not complete.

    ``cache_dir`` defaults to :func:`default_cache_root`. Safe against crashes and concurrent callers: the build
    goes to a temporary folder that is renamed into place in one step; a loser of the race drops its own copy.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    final_dir = root / CACHE_VERSION
    if (final_dir / MANIFEST_NAME).is_file():
        return _paths_in(final_dir)
    if final_dir.exists():
        raise MilesConfigError(
            f"embedded default cache {final_dir} exists but has no {MANIFEST_NAME}, so it was not written by "
            f"miles (or was edited); it must be a complete build. Delete that folder and miles rebuilds it."
        )
    try:
        root.mkdir(parents=True, exist_ok=True)
        build_dir = Path(tempfile.mkdtemp(prefix=f".{CACHE_VERSION}.build-", dir=root))
    except OSError as exc:
        raise MilesConfigError(
            f"cannot create the embedded default cache under {root} ({exc}); the folder must be writable. "
            f"Set {CACHE_ENV_VAR} to a writable folder."
        ) from exc
    _remove_stale_builds(root)
    try:
        build_embedded_default(build_dir)
        _publish(build_dir, final_dir)
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)  # gone already after a successful os.replace
    return _paths_in(final_dir)


def _paths_in(folder: Path) -> EmbeddedPaths:
    return EmbeddedPaths(
        checkpoint_dir=str(folder / "checkpoint"),
        train_jsonl=str(folder / "train.jsonl"),
        eval_jsonl=str(folder / "eval.jsonl"),
    )


def _publish(build_dir: Path, final_dir: Path) -> None:
    try:
        os.replace(build_dir, final_dir)
    except OSError:
        # Another process published first (the target is a non-empty folder). Builds are deterministic, so
        # its copy is as good as ours, provided it is complete.
        if not (final_dir / MANIFEST_NAME).is_file():
            raise


def _remove_stale_builds(root: Path) -> None:
    """Best effort: drop temporary folders left by builds that crashed long ago (never a running one)."""
    now = time.time()
    for leftover in root.glob(f".{CACHE_VERSION}.build-*"):
        try:
            if now - leftover.stat().st_mtime > _STALE_BUILD_SECONDS:
                shutil.rmtree(leftover, ignore_errors=True)
        except OSError:
            pass


def build_embedded_default(out_dir: Path) -> None:
    """Write tokenizer, warmed-up model, train/eval JSONL and the manifest (last) into ``out_dir``."""
    started = time.perf_counter()
    checkpoint_dir = out_dir / "checkpoint"
    tokenizer = build_tokenizer()
    train_pairs, eval_pairs = split_pairs()
    threads_before = torch.get_num_threads()
    # One thread: a tiny model trains ~10x faster than with two contending ones, and the sums are reproducible.
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG as it was
            model = build_model(seed=SFT_SEED)
            sft_warmup(model, tokenizer, train_pairs)
    finally:
        torch.set_num_threads(threads_before)
    with quiet_transformers_progress():
        model.save_pretrained(checkpoint_dir, safe_serialization=True)
    tokenizer.save_pretrained(checkpoint_dir)
    write_prompt_jsonl(out_dir / "train.jsonl", train_pairs)
    write_prompt_jsonl(out_dir / "eval.jsonl", eval_pairs)
    manifest = {
        "cache_version": CACHE_VERSION,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "num_train_prompts": len(train_pairs),
        "num_eval_prompts": len(eval_pairs),
        "sft": {"steps": SFT_STEPS, "batch_size": SFT_BATCH_SIZE, "lr": SFT_LR, "seed": SFT_SEED},
        "build_seconds": round(time.perf_counter() - started, 3),
    }
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")


# The chat template (for --apply-chat-template): a conversation is its turns' text, each answer closed by <eos>,
# the format the SFT warm-up teaches ("3+4=" then "7<eos>"). The generation prompt adds nothing, as the task's
# prompts end with "=", so a single-turn prompt renders as itself and the model keeps its skill under the flag.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}<eos>{% endif %}{% endfor %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of ``VOCAB``; encoding prepends ``<bos>``; decoding concatenates characters; the
    chat template is ``CHAT_TEMPLATE``."""
    vocab = {token: token_id for token_id, token in enumerate(VOCAB)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   chat_template=CHAT_TEMPLATE)


def build_model(seed: int) -> Qwen2ForCausalLM:
    """A freshly initialized tiny Qwen2 (fp32), seeded so the build is deterministic."""
    config = Qwen2Config(
        vocab_size=len(VOCAB),
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=VOCAB.index("<pad>"),
        bos_token_id=VOCAB.index("<bos>"),
        eos_token_id=VOCAB.index("<eos>"),
        dtype="float32",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).to(torch.float32)


def split_pairs() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """All 100 digit pairs (a, b), shuffled with a fixed seed: the first 20 are held out for evaluation."""
    pairs = [(a, b) for a in range(10) for b in range(10)]
    random.Random(SPLIT_SEED).shuffle(pairs)
    return pairs[NUM_EVAL_PROMPTS:], pairs[:NUM_EVAL_PROMPTS]


def prompt_text(a: int, b: int) -> str:
    return f"{a}+{b}="


def write_prompt_jsonl(path: Path, pairs: list[tuple[int, int]]) -> None:
    lines = [json.dumps({"prompt": prompt_text(a, b), "label": str(a + b)}) for a, b in pairs]
    path.write_text("\n".join(lines) + "\n")


def sft_batch(
    tokenizer: PreTrainedTokenizerFast, pairs: list[tuple[int, int]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``<bos>a+b=`` + answer + ``<eos>``; returns input ids, attention mask and labels, each (B, T).

    Labels are -100 (ignored by the loss) on prompt and padding tokens, so only the answer is learned.
    """
    rows, prompt_lengths = [], []
    for a, b in pairs:
        prompt_ids = tokenizer(prompt_text(a, b))["input_ids"]
        answer_ids = tokenizer(str(a + b), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(prompt_ids + answer_ids)
        prompt_lengths.append(len(prompt_ids))
    max_len = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), max_len), tokenizer.pad_token_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(rows), max_len), dtype=torch.long)  # (B, T)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention_mask[i, : len(row)] = 1
    labels = input_ids.masked_fill(attention_mask == 0, -100)  # (B, T)
    for i, prompt_length in enumerate(prompt_lengths):
        labels[i, :prompt_length] = -100
    return input_ids, attention_mask, labels


def sft_warmup(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    train_pairs: list[tuple[int, int]],
    steps: int = SFT_STEPS,
    batch_size: int = SFT_BATCH_SIZE,
    lr: float = SFT_LR,
    seed: int = SFT_SEED,
) -> list[float]:
    """Supervised warm-up on the train split: mean cross-entropy of the answer tokens, Adam. Returns the losses.

    Each step draws ``batch_size`` train pairs with replacement from a generator seeded with ``seed``.
    """
    input_ids, attention_mask, labels = sft_batch(tokenizer, train_pairs)  # (N, T) each
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        rows = torch.randint(len(train_pairs), (batch_size,), generator=generator)  # (B,)
        # HF shifts the labels: the logits at position t are scored against token t + 1.
        loss = model(input_ids=input_ids[rows], attention_mask=attention_mask[rows], labels=labels[rows]).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses
