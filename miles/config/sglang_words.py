"""The SGLang words of a command line (``--sglang-*``, and ``--no-sglang-*`` for a negated switch) and the router
words (``--router-*``, sglang-router's own options with upstream's prefix), set aside before argparse runs
(``parse_args``).

Pure and import-free (it runs before the contract, which nothing outside the code may switch off); the words are
parsed and checked by SGLang's own parser and by sglang-router's in the preflight (``miles.rollout.sglang_args``,
``miles.rollout.router``).
"""

from __future__ import annotations

PREFIX = "--sglang-"
# upstream's router flags, miles' own (``flags.add_router_arguments``), not SGLang server arguments
OWN_ROUTER_PREFIX = "--sglang-router-"
# sglang-router's options, as upstream registers them (``RouterArgs.add_cli_args(use_router_prefix=True)``)
ROUTER_PREFIX = "--router-"
# argparse's negation of a boolean SGLang switch: upstream registers SGLang's ``--NAME`` as ``--sglang-NAME``, and a
# BooleanOptionalAction then adds ``--no-sglang-NAME`` for SGLang's ``--no-NAME``
NEGATED_PREFIX = "--no-sglang-"


def sglang_option(word: str) -> str | None:
    """The SGLang option a word names (``--sglang-tp-size=2`` -> ``--tp-size``, ``--no-sglang-foo`` ->
    ``--no-foo``), or None for a word that is not an SGLang server argument."""
    if word.startswith(OWN_ROUTER_PREFIX):
        return None
    for prefix, option_prefix in ((PREFIX, "--"), (NEGATED_PREFIX, "--no-")):
        if word.startswith(prefix) and len(word) > len(prefix):
            return option_prefix + word[len(prefix):].split("=", 1)[0]
    return None


def split_sglang_words(argv: list[str]) -> tuple[list[str], list[str]]:
    """(argv without the SGLang words, those words). A ``--sglang-NAME`` followed by a word that does not start with
    ``--`` takes it as its value; otherwise it stands alone (a switch, or ``NAME=VALUE``); a ``--no-sglang-NAME`` is
    a switch."""
    rest, words, index = [], [], 0
    while index < len(argv):
        word = argv[index]
        if sglang_option(word) is not None:
            words.append(word)
            takes_next = (word.startswith(PREFIX) and "=" not in word and index + 1 < len(argv)
                          and not argv[index + 1].startswith("--"))
            if takes_next:
                words.append(argv[index + 1])
            index += 1 + takes_next
        else:
            rest.append(word)
            index += 1
    return rest, words


def router_option(word: str) -> str | None:
    """The sglang-router option a word names (``--router-policy=random`` -> ``--policy``), or None."""
    if word.startswith(ROUTER_PREFIX) and len(word) > len(ROUTER_PREFIX):
        return "--" + word[len(ROUTER_PREFIX):].split("=", 1)[0]
    return None


def split_router_words(argv: list[str]) -> tuple[list[str], list[str]]:
    """(argv without the router words, those words). A ``--router-NAME`` takes every following word that does not
    start with ``--`` (some of sglang-router's options take several: ``--router-prefill URL PORT``)."""
    rest, words, taking = [], [], False
    for word in argv:
        if router_option(word) is not None:
            words.append(word)
            taking = "=" not in word
        elif taking and not word.startswith("--"):
            words.append(word)
        else:
            rest.append(word)
            taking = False
    return rest, words
