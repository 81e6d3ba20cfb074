"""Reading a W&B run back from its `.wandb` file, offline: the history a run logged, without the W&B service.

The file is a LevelDB log (https://github.com/google/leveldb/blob/main/doc/log_format.md) of serialized
`wandb.proto.wandb_internal_pb2.Record`s, as wandb-core (0.18 and later) writes it:
- 32 KiB blocks; the first block starts with a 7-byte file header `:W&B`, magic 0xBEE1 (uint16 LE),
  version 0, and its chunks follow the header;
- every chunk has a 7-byte header: checksum (uint32 LE), payload length (uint16 LE), type (1 FULL, 2 FIRST,
  3 MIDDLE, 4 LAST), then the payload; a record is one FULL chunk or FIRST, MIDDLE..., LAST;
- the checksum is the IEEE CRC-32 (`zlib.crc32`) of the type byte and the payload (wandb's choice, where
  LevelDB itself uses masked CRC-32C);
- fewer than 7 bytes left in a block are zero padding, and so is a chunk header of all zeros.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from inloop_eval.errors import InLoopEvalError

BLOCK_SIZE = 32 * 1024
HEADER_SIZE = 7
FILE_IDENT = b":W&B"
FILE_MAGIC = 0xBEE1
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class WandbFileError(InLoopEvalError):
    """A `.wandb` file that is not a W&B run log, or is corrupt."""


def read_chunks(data: bytes, where: str = "<bytes>") -> Iterator[bytes]:
    """Payloads of the records in a LevelDB log whose first block starts with W&B's 7-byte file header."""
    ident, magic, version = struct.unpack_from("<4sHB", data, 0) if len(data) >= 7 else (b"", 0, 0)
    if ident != FILE_IDENT or magic != FILE_MAGIC:
        raise WandbFileError(
            f"{where}: not a W&B run log (expected header {FILE_IDENT!r} magic {FILE_MAGIC:#x}, "
            f"found {data[:7]!r})"
        )
    pos = HEADER_SIZE
    parts: list[bytes] = []
    while pos < len(data):
        left_in_block = BLOCK_SIZE - pos % BLOCK_SIZE
        if left_in_block < HEADER_SIZE:  # block trailer
            pos += left_in_block
            continue
        if pos + HEADER_SIZE > len(data):
            break  # a writer stopped mid-header: the record never completed
        checksum, length, kind = struct.unpack_from("<IHB", data, pos)
        if checksum == 0 and length == 0 and kind == 0:  # zero padding to the end of the block
            pos += left_in_block
            continue
        payload = data[pos + HEADER_SIZE : pos + HEADER_SIZE + length]
        if len(payload) < length:
            break  # truncated last chunk (a run still writing, or killed)
        if zlib.crc32(bytes([kind]) + payload) != checksum:
            raise WandbFileError(f"{where}: checksum mismatch in the chunk at byte {pos}")
        pos += HEADER_SIZE + length
        if kind == FULL:
            yield payload
        elif kind == FIRST:
            parts = [payload]
        elif kind == MIDDLE:
            parts.append(payload)
        elif kind == LAST:
            parts.append(payload)
            yield b"".join(parts)
            parts = []
        else:
            raise WandbFileError(f"{where}: unknown chunk type {kind} at byte {pos - HEADER_SIZE - length}")


def read_records(path: str | Path) -> Iterator[Any]:
    """Every `Record` of a `.wandb` file, in order."""
    from wandb.proto import wandb_internal_pb2

    path = Path(path)
    for payload in read_chunks(path.read_bytes(), str(path)):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def read_history(path: str | Path) -> list[dict[str, Any]]:
    """The run's history rows (one per `run.log` call), keys as logged, values decoded from JSON."""
    rows = []
    for record in read_records(path):
        if record.WhichOneof("record_type") != "history":
            continue
        row = {}
        for item in record.history.item:
            key = item.key or ".".join(item.nested_key)
            row[key] = json.loads(item.value_json)
        rows.append(row)
    return rows


def read_config(path: str | Path) -> dict[str, Any]:
    """The run's config as the run record and later config records set it."""
    config: dict[str, Any] = {}
    for record in read_records(path):
        kind = record.WhichOneof("record_type")
        updates = (
            record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
        )
        for item in updates:
            key = item.key or ".".join(item.nested_key)
            if not key.startswith("_wandb"):
                config[key] = json.loads(item.value_json)
    return config


def is_finished(path: str | Path) -> bool:
    """Whether the run's `exit` record is on disk (the W&B service may still be writing for a moment after
    `run.finish()` returns or the training process exits)."""
    return any(record.WhichOneof("record_type") == "exit" for record in read_records(path))


def find_run_files(directory: str | Path) -> list[Path]:
    """`.wandb` files under `directory` (a run directory, a `wandb/` directory or a run dir holding one)."""
    directory = Path(directory)
    found = sorted(directory.glob("run-*.wandb")) or sorted(directory.glob("**/run-*.wandb"))
    unique = {f.resolve(): f for f in found if "latest-run" not in f.parts}  # `latest-run` is a link
    return sorted(unique.values())
