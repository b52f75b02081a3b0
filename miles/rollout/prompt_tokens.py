"""Encoding prompts, with one clear error for a prompt the model cannot take.

Used twice with the same rules: by the preflight on the whole prompt file when that is cheap, and by the rollout
engine on each batch when it is first generated (docs/training.md#checked-at-startup says when which applies).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from miles.utils.errors import MilesConfigError


def encode_prompts(
    tokenizer,
    texts: Sequence[str],
    max_positions: int | None,
    max_response_len: int,
    row_name: Callable[[int], str],
    budget_name: str = "--rollout-max-response-len",
) -> list[list[int]]:
    """Token ids of each prompt. A prompt the tokenizer cannot encode, one that encodes to no tokens, or one whose
    tokens plus ``max_response_len`` new ones exceed ``max_positions`` (the model's position limit; ``None``:
    unknown) is a ``MilesConfigError`` naming it by ``row_name(index)`` and the budget by ``budget_name``."""
    try:
        encoded = tokenizer(list(texts))["input_ids"]
    except Exception:  # the tokenizers library raises a bare Exception; find the prompt it failed on
        encoded = [_encode_one(tokenizer, text, row_name(index)) for index, text in enumerate(texts)]
    encoded = [list(ids) for ids in encoded]
    check_positions(encoded, max_response_len, max_positions, row_name, budget_name)
    return encoded


def check_positions(prompt_ids: list[list[int]], max_response_len: int, max_positions: int | None,
                    row_name: Callable[[int], str] = lambda i: f"prompt {i}",
                    budget_name: str = "max_new_tokens") -> None:
    """Every prompt has a token, and its tokens plus ``max_response_len`` new ones fit ``max_positions``."""
    for index, ids in enumerate(prompt_ids):
        if not ids:
            raise MilesConfigError(
                f"{row_name(index)} encodes to no tokens; every prompt needs at least one token. Remove it."
            )
        if max_positions is not None and len(ids) + max_response_len > max_positions:
            raise MilesConfigError(
                f"{row_name(index)} is {len(ids)} tokens, which with {budget_name} {max_response_len} "
                f"exceeds the model's {max_positions} positions (max_position_embeddings). Shorten or drop the "
                f"prompt, or lower {budget_name} to {max(max_positions - len(ids), 0)} or less."
            )


def _encode_one(tokenizer, text: str, name: str) -> list[int]:
    try:
        return tokenizer(text)["input_ids"]
    except Exception as exc:  # see encode_prompts
        unknown = sorted({char for char in text if char not in tokenizer.get_vocab()})
        if not unknown:
            raise MilesConfigError(
                f"{name} cannot be encoded by the tokenizer of --hf-checkpoint ({exc}). Fix or drop the prompt."
            ) from None
        # A tokenizer without an unknown token (the embedded one) says "Missing [UNK] token from the vocabulary":
        # it means the text has characters outside the vocabulary, not that an [UNK] token is expected.
        raise MilesConfigError(
            f"{name} has characters that are not in the vocabulary of the --hf-checkpoint tokenizer "
            f"({''.join(unknown)!r}), which has no unknown token to fall back on. Remove them from the data, or "
            f"use a model whose tokenizer covers them."
        ) from None
