"""The ``--sglang-*`` words of a command line, set aside before argparse runs (``parse_args``).

Pure and import-free (it runs before the contract, which nothing outside the code may switch off); the words are
parsed and checked by SGLang's own parser in the preflight (``miles.rollout.sglang_args``).
"""

from __future__ import annotations

PREFIX = "--sglang-"


def split_sglang_words(argv: list[str]) -> tuple[list[str], list[str]]:
    """(argv without the ``--sglang-*`` words, those words). A ``--sglang-NAME`` followed by a word that does not
    start with ``--`` takes it as its value; otherwise it stands alone (a switch, or ``NAME=VALUE``)."""
    rest, words, index = [], [], 0
    while index < len(argv):
        word = argv[index]
        if word.startswith(PREFIX) and len(word) > len(PREFIX):
            words.append(word)
            takes_next = "=" not in word and index + 1 < len(argv) and not argv[index + 1].startswith("--")
            if takes_next:
                words.append(argv[index + 1])
            index += 1 + takes_next
        else:
            rest.append(word)
            index += 1
    return rest, words
