"""Read an offline wandb run's ``.wandb`` file: the history rows it would upload on ``wandb sync``.

The file is wandb's transaction log: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then 32 KiB blocks of
LevelDB-log records (crc32 4 bytes, length 2, type 1: full, first, middle, last; a block's tail shorter than a
record header is zero padding), each record one ``wandb_internal_pb2.Record`` protobuf (wandb's own schema).
wandb 0.31 reads the file in its Go core only, so this small reader is the test's.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

BLOCK, HEADER = 32 * 1024, struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[bytes]:
    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a wandb transaction log")
    position, out, pending = 7, [], b""
    while position + HEADER.size <= len(data):
        left_in_block = BLOCK - position % BLOCK
        if left_in_block < HEADER.size:
            position += left_in_block  # zero padding at the end of a block
            continue
        checksum, length, kind = HEADER.unpack_from(data, position)
        if length == 0 and kind == 0:
            break
        payload = data[position + HEADER.size : position + HEADER.size + length]
        if zlib.crc32(bytes([kind]) + payload) & 0xFFFFFFFF != checksum:
            raise ValueError(f"{path}: bad checksum at byte {position}")
        position += HEADER.size + length
        pending = payload if kind in (FULL, FIRST) else pending + payload
        if kind in (FULL, LAST):
            out.append(pending)
    return out


def history(run_dir: Path) -> tuple[list[dict], dict]:
    """The history rows (``_step`` included) and the config of the one offline run under ``run_dir/wandb``."""
    from wandb.proto import wandb_internal_pb2

    (path,) = Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")
    rows, config = [], {}
    for data in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
        elif kind in ("run", "config"):  # the config is in the run record, or in a later config record
            update = record.run.config.update if kind == "run" else record.config.update
            config.update({item.key: json.loads(item.value_json) for item in update})
    return rows, config
