"""Reads a W&B offline run directory back: the records of its ``run-<id>.wandb`` file, decoded with wandb's own
protobuf messages (``wandb.proto.wandb_internal_pb2.Record``). wandb ships no Python reader of that file any more
(its core writes it), so the framing is read here: a 7-byte header (":W&B", magic 0xBEE1, version 0), then 32 KiB
blocks of chunks, each a 7-byte header (checksum u32, length u16, type u8: 1 full, 2 first, 3 middle, 4 last) and
its bytes, with the tail of a block too short for a header left as padding."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
FILE_HEADER = 7
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out = []
    pending = b""
    offset = FILE_HEADER
    while offset + CHUNK_HEADER <= len(data):
        left_in_block = BLOCK - offset % BLOCK
        if left_in_block < CHUNK_HEADER:
            offset += left_in_block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[offset : offset + CHUNK_HEADER])
        body = data[offset + CHUNK_HEADER : offset + CHUNK_HEADER + length]
        offset += CHUNK_HEADER + length
        if kind == 0 and length == 0:
            continue  # zero padding
        pending = body if kind in (FULL, FIRST) else pending + body
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def history(run_dir: Path) -> list[dict[str, Any]]:
    """Every logged row of one offline run directory, in order (keys as logged, ``_step`` included)."""
    (path,) = run_dir.glob("run-*.wandb")
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows


def run_info(run_dir: Path) -> tuple[str, str, dict[str, Any]]:
    """(run id, display name, config) from the run record of an offline run directory."""
    (path,) = run_dir.glob("run-*.wandb")
    for record in records(path):
        if record.WhichOneof("record_type") == "run":
            config = {item.key: json.loads(item.value_json) for item in record.run.config.update}
            return record.run.run_id, record.run.display_name, config
    raise AssertionError(f"no run record in {path}")
