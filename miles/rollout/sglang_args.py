"""``--sglang-*`` flags: SGLang's server arguments under miles' prefix, checked against SGLang's own ``ServerArgs``.

``split_sglang_words(argv)`` (``miles.config.sglang_words``) runs in ``parse_args`` and imports nothing (the contract's rejection stays as fast as
starting Python): it only takes the ``--sglang-NAME [VALUE]`` / ``--sglang-NAME=VALUE`` words out of argv. The
preflight (before Ray starts) then parses them with SGLang's own parser (``ServerArgs.add_cli_args``), so an unknown
name or a bad value is one ``error:`` line, and refuses the settings miles owns when they are set wrongly
(``OWNED``). ``engine_kwargs`` is what every engine starts with: miles' settings, then the user's.
"""

from __future__ import annotations

import argparse
import difflib
import os

from miles.config.sglang_words import NEGATED_PREFIX, PREFIX, sglang_option
from miles.utils.errors import MilesConfigError

DEFAULT_MAX_TOTAL_TOKENS = 2048  # KV-cache tokens; SGLang's default memory fraction took 17 GB of host memory here
LOGPROB_ENV = "SGLANG_RETURN_ORIGINAL_LOGPROB"


def _sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="--sglang-*", add_help=False, exit_on_error=False)
    ServerArgs.add_cli_args(parser)

    def refuse(message: str):
        raise MilesConfigError(f"--sglang-* flags: SGLang's parser refused them: {message}. "
                               "See `python -m sglang.launch_server --help` for SGLang's server arguments.")

    parser.error = refuse
    return parser


def parse_sglang_words(words: list[str]) -> dict:
    """{ServerArgs field: value} of the words the user gave, typed by SGLang's parser; an unknown name is refused
    with the closest names."""
    parser = _sglang_parser()
    options = parser._option_string_actions  # SGLang's own option table: the only source of names
    translated, given = [], []
    for word in words:
        option = sglang_option(word)
        if option is None:  # the value of the word before it
            translated.append(word)
            continue
        if option not in options:
            close = difflib.get_close_matches(option, list(options), n=3)
            raise MilesConfigError(
                f"{word.split('=', 1)[0]}: SGLang {_sglang_version()} has no server argument {option}"
                + (f" (did you mean {', '.join(_miles_spelling(c, options[c]) for c in close)}?)" if close else "")
                + "; drop it or use a name from `python -m sglang.launch_server --help` with the --sglang- prefix.")
        given.append(options[option].dest)
        translated.append(option + word[len(word.split("=", 1)[0]):])
    try:
        namespace = parser.parse_args(["--model-path=<--hf-checkpoint>", *translated])  # required by SGLang; miles sets it
    except argparse.ArgumentError as error:
        raise MilesConfigError(f"--sglang-* flags: {error}; pass a value SGLang accepts.") from None
    return {dest: getattr(namespace, dest) for dest in given}


def _miles_spelling(option: str, action: argparse.Action) -> str:
    """How a miles (and upstream) command line spells SGLang's ``option``: ``--no-X`` of a boolean switch is
    ``--no-sglang-X``, every other option ``--sglang-NAME``."""
    if isinstance(action, argparse.BooleanOptionalAction) and option.startswith("--no-"):
        return NEGATED_PREFIX + option[len("--no-"):]
    return PREFIX + option[2:]


def _sglang_version() -> str:
    from importlib.metadata import version

    return version("sglang")


def _same_path(a, b) -> bool:
    return a is not None and b is not None and os.path.realpath(a) == os.path.realpath(b)


def check_owned(values: dict, hf_checkpoint: str, cuda: bool) -> None:
    """Refuse a setting miles owns when it is set to something else than what miles needs (value, rule, fix)."""
    rules = [
        ("model_path", lambda v: _same_path(v, hf_checkpoint),
         f"the engines load --hf-checkpoint ({hf_checkpoint}), the weights the trainer starts from",
         "set --hf-checkpoint instead"),
        ("tokenizer_path", lambda v: _same_path(v, hf_checkpoint),
         "the engines tokenize with --hf-checkpoint's tokenizer, as the trainer does", "drop it"),
        ("device", lambda v: v == ("cuda" if cuda else "cpu"),
         f"miles places each engine on {'a GPU' if cuda else 'the CPU (no GPU here)'}", "drop it"),
        ("dtype", lambda v: v in ("float32", "bfloat16"),
         "the engine's dtype must be explicit ('auto' downcast a float32 checkpoint to float16)",
         "pass --sglang-dtype float32 (the default) or bfloat16"),
        ("mem_fraction_static", lambda v: cuda,
         "on a CPU SGLang sizes the KV cache from host memory (17 GB here)", "pass --sglang-max-total-tokens N"),
        ("random_seed", lambda v: False, "the engines' seeds come from --rollout-seed", "set --rollout-seed"),
        ("tp_size", lambda v: v == 1, "miles checks the weights of one rank per engine", "drop it"),
        ("dp_size", lambda v: v == 1, "miles runs one data-parallel replica per engine",
         "raise --rollout-num-engines instead"),
        ("pp_size", lambda v: v == 1, "miles checks the weights of one rank per engine", "drop it"),
        *[(dest, lambda v: False, "miles starts each engine's SGLang server on 127.0.0.1 and a free port, and the "
           "engine's actor calls it without a key", "drop it (the router's address is --sglang-router-ip/"
           "--sglang-router-port)") for dest in ("host", "port", "api_key", "admin_api_key")],
        ("config", lambda v: False, "a config file's options would pass around miles' check of each --sglang-* flag",
         "pass its options as --sglang-NAME VALUE"),
        ("enable_deterministic_inference", lambda v: cuda or not v,
         "SGLang's deterministic inference needs one of its deterministic attention backends (fa3, fa4, flashinfer, "
         "triton, ...), none of which runs on a CPU (on a GPU each sample gets its own seed from --rollout-seed)",
         "drop it"),
        ("rl_on_policy_target", lambda v: v is None,
         "it casts the logits to bfloat16 before the log-softmax, so the rollout log-probs are not the trainer's",
         "drop it"),
    ]
    for dest, holds, rule, fix in rules:
        if dest in values and not holds(values[dest]):
            raise MilesConfigError(f"--sglang-{dest.replace('_', '-')} {values[dest]!r}: {rule}; {fix}.")
    if os.environ.get(LOGPROB_ENV, "").lower() in ("1", "true", "yes", "on"):
        raise MilesConfigError(f"${LOGPROB_ENV} is set: SGLang would return log-probs before the temperature, not "
                               f"the trainer's log softmax(logits / temperature); unset it.")


def check_sglang_server_args(words: list[str], hf_checkpoint: str, cuda: bool) -> dict:
    """The preflight's check of ``--rollout-backend sglang``: the extra is installed, the words parse, the owned
    settings hold. Returns the user's settings for ``engine_kwargs``."""
    from importlib.util import find_spec

    if find_spec("sglang") is None:
        raise MilesConfigError("--rollout-backend sglang: the SGLang rollout engine is not installed; install it "
                               "with `bash scripts/setup.sh --with-sglang` (docs/sglang.md), or use "
                               "--rollout-backend torch.")
    values = parse_sglang_words(words)
    check_owned(values, hf_checkpoint, cuda)
    return values


def engine_kwargs(hf_checkpoint: str, seed: int, user_values: dict) -> dict:
    """``sglang.Engine`` keyword arguments: miles' settings (docs/sglang.md, "Settings"), then the user's."""
    import torch

    cuda = torch.cuda.is_available()
    kwargs = {"model_path": hf_checkpoint, "device": "cuda" if cuda else "cpu", "dtype": "float32",
              "random_seed": seed, "grammar_backend": "none", "log_level": "error"}
    if not cuda:
        kwargs.update(max_total_tokens=DEFAULT_MAX_TOTAL_TOKENS, disable_overlap_schedule=True)
    kwargs.update(user_values)
    return kwargs


def max_request_tokens(server_args: dict, cuda: bool) -> int | None:
    """The most tokens one request can hold in the engine's KV cache: --sglang-max-total-tokens, miles' CPU default,
    or None where SGLang sizes the cache from a GPU's memory (then its context length is the limit)."""
    return server_args.get("max_total_tokens", None if cuda else DEFAULT_MAX_TOTAL_TOKENS)


def check_kv_capacity(prompt_ids: list[list[int]], max_response_len: int, max_tokens: int | None) -> None:
    """SGLang caps a request's new tokens at (its KV cache or context) - prompt - 2 without an error
    (``Scheduler.init_req_max_new_tokens``): refuse prompts whose longest plus the response budget do not fit."""
    longest = max(len(ids) for ids in prompt_ids)
    if max_tokens is not None and longest + max_response_len + 2 > max_tokens:
        raise MilesConfigError(
            f"--rollout-max-response-len {max_response_len} with a {longest}-token prompt needs "
            f"{longest + max_response_len + 2} tokens in one SGLang request, but the engine's KV cache holds {max_tokens} "
            "(--sglang-max-total-tokens); SGLang would cut the responses short silently. Raise "
            "--sglang-max-total-tokens, or lower --rollout-max-response-len.")
