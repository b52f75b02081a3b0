"""Prompt data: upstream-format JSONL and Parquet loaders and a deterministic, resumable source of rollout batches."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

from miles.utils.errors import MilesConfigError


def load_prompt_data(path: str, input_key: str, label_key: str | None, flag: str = "--prompt-data") -> list[dict]:
    """Read a JSONL file of objects, or a Parquet file (``*.parquet``) of rows, into ``[{"prompt": str, "label":
    value}, ...]`` in file order.

    ``input_key`` names the prompt (a string); ``label_key`` the label, which keeps its value as upstream keeps it
    (a string, a number, an object as a dict: upstream's reward functions read ``sample.label["ground_truth"]``);
    ``label_key=None`` means no labels (label ""). Blank JSONL lines are skipped. Every problem is a
    ``MilesConfigError`` naming ``flag``, the file, the line (or row) and the fix.
    """
    file = Path(path).expanduser()
    source = f"{flag} {path!r}"
    if not file.is_file():
        example = json.dumps({input_key: "3+4=", label_key or "label": "7"})
        what = "a folder, not a file" if file.is_dir() else "no such file"
        raise MilesConfigError(
            f"{source}: {what}. Pass a JSONL file with one object per line, e.g. {example}, or a Parquet file with "
            f"those columns, or leave the flag out for the embedded task."
        )
    records = _parquet_rows(file, source) if file.suffix == ".parquet" else _jsonl_objects(file, source)
    prompts = [_prompt(record, where, input_key, label_key) for where, record in records]
    if not prompts:
        raise MilesConfigError(
            f"{source} has no prompts (the file is empty or blank). Write one JSON object per line, or one row per "
            f"prompt."
        )
    return prompts


def _jsonl_objects(file: Path, source: str) -> Iterator[tuple[str, dict]]:
    """(where, object) of each non-blank line; a line that is not a JSON object is an error naming it."""
    for line_number, line in _utf8_lines(file, source):
        if not line.strip():
            continue
        where = f"{source} line {line_number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise MilesConfigError(f"{where} is not valid JSON ({exc.msg} at column {exc.colno}); fix that line.") from exc
        if not isinstance(record, dict):
            raise MilesConfigError(
                f"{where} is a JSON {type(record).__name__}, not an object; write one object per line.")
        yield where, record


def _parquet_rows(file: Path, source: str) -> Iterator[tuple[str, dict]]:
    """(where, row as a dict of Python values) of each row of a Parquet file (pyarrow: a struct column's values
    are dicts, a list column's lists)."""
    import pyarrow
    import pyarrow.parquet

    try:
        rows = pyarrow.parquet.read_table(file).to_pylist()
    except (pyarrow.ArrowException, OSError) as exc:
        raise MilesConfigError(
            f"{source} is not a readable Parquet file ({type(exc).__name__}: {exc}). Write it with pandas' or "
            f"pyarrow's to_parquet, or pass a JSONL file.") from None
    for row_number, row in enumerate(rows):
        yield f"{source} row {row_number}", row


def _utf8_lines(file: Path, source: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line; a line that is not UTF-8 is an error naming its line and byte offset."""
    offset = 0
    with file.open("rb") as raw_lines:
        for line_number, raw in enumerate(raw_lines, start=1):
            try:
                yield line_number, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise MilesConfigError(
                    f"{source} line {line_number} (byte {offset + exc.start} of the file) is not UTF-8 "
                    f"({raw[exc.start:exc.start + 1]!r}: {exc.reason}). Save the file as UTF-8, e.g. "
                    f"iconv -f latin1 -t utf-8."
                ) from None
            offset += len(raw)


def _prompt(record: dict, where: str, input_key: str, label_key: str | None) -> dict:
    for key, flag in ((input_key, "--input-key"), (label_key, "--label-key")):
        if key is not None and key not in record:
            raise MilesConfigError(
                f"{where} has no key {key!r} (its keys: {sorted(record)}); add it, or set {flag} to the key your "
                f"data uses."
            )
    prompt = record[input_key]
    if not isinstance(prompt, str):
        raise MilesConfigError(
            f"{where}: the prompt under {input_key!r} is a {type(prompt).__name__}, not a string; store the text."
        )
    return {"prompt": prompt, "label": "" if label_key is None else record[label_key]}


def load_prompts(args, path: str, flag: str, keys: tuple[str, str | None] | None = None) -> list[dict]:
    """The prompt file at ``path`` as the rollout uses it: each prompt through the tokenizer's chat template under
    --apply-chat-template (``chat_prompt``), as it is otherwise. ``keys``: (input key, label key), if not the
    launch's --input-key and --label-key (an evaluation dataset's own)."""
    input_key, label_key = keys or (args.input_key, args.label_key)
    prompts = load_prompt_data(path, input_key, label_key, flag=flag)
    if not args.apply_chat_template:
        return prompts
    from miles.models.hf import load_tokenizer  # transformers: only for a templated launch

    tokenizer = load_tokenizer(args.hf_checkpoint)
    if tokenizer.chat_template is None:
        raise MilesConfigError(
            f"--apply-chat-template is set, but the tokenizer of --hf-checkpoint {args.hf_checkpoint} has no chat "
            "template (no chat_template in its tokenizer_config.json). Use a chat model's checkpoint, or drop "
            "--apply-chat-template to use the prompts as the data gives them."
        )
    kwargs = args.apply_chat_template_kwargs
    if not isinstance(kwargs, dict):
        raise MilesConfigError(
            f"--apply-chat-template-kwargs is the JSON {type(kwargs).__name__} {kwargs!r}, but it must be an object "
            'of template variables. Pass e.g. --apply-chat-template-kwargs \'{"enable_thinking": false}\'.'
        )
    return [{**prompt, "prompt": chat_prompt(tokenizer, prompt["prompt"], kwargs)} for prompt in prompts]


def chat_prompt(tokenizer, text: str, kwargs: dict) -> str:
    """Upstream's meaning of --apply-chat-template: the prompt text is one user message, rendered (not tokenized)
    by the tokenizer's chat template with the generation prompt, the template variables of
    --apply-chat-template-kwargs passed through."""
    messages = [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)


class PromptDataSource:
    """Rollout k reads the prompts from position p(k) of an endless stream of epochs over the data: ``draw(k, n)``
    takes the next n (one batch of B = --rollout-batch-size, or rounds of --over-sampling-batch-size under dynamic
    sampling), and ``finish(k)`` records that the next rollout starts where k's draws ended:
    p(k + 1) = p(k) + the prompts rollout k drew. A rollout that has not started yet is at
    p(k) = p_s + (k − s)·B from the origin (s, p_s): (0, 0) for a fresh run, so p(k) = k·B without dynamic sampling.

    Epoch e is the data in file order, or, with ``shuffle``, permuted by ``random.Random(seed + e)``. A batch may
    run across an epoch boundary. The prompts depend only on (prompts, shuffle, seed) and the positions, so a
    resume that continues at the position the checkpoint recorded (``continue_at``) reads what the straight run
    would have, even with another --rollout-batch-size: no prompt is skipped or repeated.
    """

    def __init__(self, prompts: list[dict], rollout_batch_size: int, shuffle: bool, seed: int):
        if not prompts:
            raise MilesConfigError("the prompt data source got no prompts; the prompt file must have at least one.")
        if isinstance(rollout_batch_size, bool) or not isinstance(rollout_batch_size, int) or rollout_batch_size < 1:
            raise MilesConfigError(f"--rollout-batch-size={rollout_batch_size!r}: must be a positive integer.")
        self.prompts = list(prompts)
        self.rollout_batch_size = rollout_batch_size
        self.shuffle = shuffle
        self.seed = seed
        self._epoch_orders: dict[int, list[int]] = {}
        self._origin = (0, 0)  # (rollout id s, its first prompt's position p_s)
        self._starts: dict[int, int] = {}  # rollout id -> its first position, for rollouts that drew (finish)
        self._drawn = 0  # prompts the rollout being generated drew so far (draw)

    def continue_at(self, rollout_id: int, position: int) -> None:
        """Rollout ``rollout_id`` starts at prompt ``position`` of the stream (a resume's saved position)."""
        self._origin, self._starts, self._drawn = (rollout_id, position), {}, 0

    def position(self, rollout_id: int) -> int:
        """p(k): the stream position of rollout ``rollout_id``'s first prompt."""
        if rollout_id in self._starts:
            return self._starts[rollout_id]
        if isinstance(rollout_id, bool) or not isinstance(rollout_id, int) or rollout_id < self._origin[0]:
            raise ValueError(f"rollout_id={rollout_id!r}: must be an integer >= {self._origin[0]}.")
        return self._origin[1] + (rollout_id - self._origin[0]) * self.rollout_batch_size

    def __len__(self) -> int:
        return len(self.prompts)

    def draw(self, rollout_id: int, count: int) -> list[dict]:
        """The next ``count`` prompts of rollout ``rollout_id``: after those it drew already (dynamic sampling)."""
        prompts = self._prompts_at(self.position(rollout_id) + self._drawn, count)
        self._drawn += count
        return prompts

    def finish(self, rollout_id: int) -> None:
        """Rollout ``rollout_id`` drew all it will: the next rollout starts where its draws ended."""
        start = self.position(rollout_id)
        self._starts = {k: p for k, p in self._starts.items() if k >= rollout_id - 1}  # a checkpoint asks k + 1
        self._starts[rollout_id] = start
        self._origin, self._drawn = (rollout_id + 1, start + self._drawn), 0

    def _prompts_at(self, start: int, count: int) -> list[dict]:
        positions = range(start, start + count)
        return [dict(self.prompts[self._epoch_order(p // len(self))[p % len(self)]]) for p in positions]

    def _epoch_order(self, epoch: int) -> Sequence[int]:
        if not self.shuffle:
            return range(len(self))
        if epoch not in self._epoch_orders:
            order = list(range(len(self)))
            random.Random(self.seed + epoch).shuffle(order)
            self._epoch_orders = {epoch: order}  # batches touch at most two epochs; keep only the newest
        return self._epoch_orders[epoch]
