"""When a checkpoint has landed: its format's completion evidence, then a settle time without change.

Evidence per format (`missing_evidence`), each the file its framework writes last or a check that every
byte is there:
- Hugging Face: `config.json`, and every safetensors file the index names (or the one `model.safetensors`)
  present at its full size: a safetensors file is complete when it is 8 + header length + the end of its
  last tensor's data bytes long, which its own header says;
- OLMo-core: `.metadata.json`, the marker its checkpointer writes after moving the finished folder into
  place, and `model_and_optim/.metadata`; `config.json` (which OLMo-core's `ConfigSaverCallback` writes
  just after) unless the model is built another way;
- torchtitan: `.metadata`, which torch.distributed.checkpoint writes after every shard.

Evidence alone is not enough for writers that put files in place one by one, or that copy a finished
checkpoint in (rsync, a sync from object storage): a checkpoint counts only once its evidence is there and
its `fingerprint` (every file's size and modification time) has stayed the same for `settle_s` seconds
(`Settling`).

Under torchrun every rank reads the checkpoint from its own view of the folder: ranks that see different
copies of it (another mount, a re-copy) would build one model out of parts of each. Their fingerprints are
compared before a read (`other_copies`): copies count as the same only with the same files of the same sizes
and modification times (one shared mount, or copies made keeping them: `cp -p`, `rsync -t`).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist

from inloop_eval.distributed import world
from inloop_eval.watch.discovery import HF, OLMO_CORE, TORCHTITAN, Checkpoint, CheckpointDamaged

HF_INDEX = "model.safetensors.index.json"
HF_SINGLE = "model.safetensors"
OLMO_CORE_MARKER = ".metadata.json"
OLMO_CORE_WEIGHTS = "model_and_optim"
DCP_METADATA = ".metadata"
CONFIG_FILE = "config.json"
# The longest header safetensors reads (its MAX_HEADER_SIZE): a longer length is a damaged file.
SAFETENSORS_MAX_HEADER = 100_000_000

# relative path -> (size, modification time in ns)
Fingerprint = dict[str, tuple[int, int]]


def fingerprint(path: Path) -> Fingerprint | None:
    """Every file under `path` with its size and modification time; None when `path` is gone."""
    out: Fingerprint = {}
    if not path.is_dir():
        return None
    for root, _, files in os.walk(path):
        for name in files:
            full = Path(root) / name
            try:
                stat = full.stat()
            except FileNotFoundError:
                continue  # removed while listed: the next fingerprint differs anyway
            out[str(full.relative_to(path))] = (stat.st_size, stat.st_mtime_ns)
    return out


def other_copies(path: Path, files: Fingerprint | None) -> str | None:
    """Which ranks see another copy of the checkpoint at `path` than rank 0 does (`files`: this rank's
    fingerprint of it), and the first file that differs; None when every rank sees the same files, and
    always in one process. One `all_gather_object` on every rank."""
    world_size, _ = world()
    if world_size == 1:
        return None
    every: list[Fingerprint | None] = [None] * world_size
    dist.all_gather_object(every, files)
    others = [r for r in range(1, world_size) if every[r] != every[0]]
    if not others:
        return None
    first, other = every[0] or {}, every[others[0]] or {}
    name = min((n for n in set(first) | set(other) if first.get(n) != other.get(n)), default="the folder")
    shown = {r: f"{f[name][0]} bytes, modified {f[name][1]} ns" if name in f else "absent"
             for r, f in ((0, first), (others[0], other))}  # fmt: skip
    return (
        f"rank(s) {', '.join(map(str, others))} see another copy of {path} than rank 0 ({name}: rank 0 "
        f"{shown[0]}, rank {others[0]} {shown[others[0]]}): not read, so that no model is made of parts of "
        "both; give every rank the same copy (one shared folder, or copies keeping sizes and modification "
        "times: cp -p, rsync -t)"
    )


def safetensors_shortfall(path: Path) -> str | None:
    """Why a safetensors file is not complete (missing, shorter than its header says); None when it is.
    CheckpointDamaged, naming the file, for a header length past safetensors' limit or a whole header that
    gives no offsets; OSError for a file that cannot be read."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                return f"{path.name} has {size} bytes, not yet a header"
            (header_len,) = struct.unpack("<Q", head)
            if header_len > SAFETENSORS_MAX_HEADER:
                raise CheckpointDamaged(
                    f"{path}: its header says it is {header_len} bytes long, past safetensors' limit of "
                    f"{SAFETENSORS_MAX_HEADER} (the file has {size}): the file is damaged; save the checkpoint again"
                )
            header = f.read(min(header_len, size))
    except FileNotFoundError:
        return f"{path.name} is missing"
    if len(header) < header_len:
        return f"{path.name} has {size} bytes, its header not yet whole"
    try:
        tensors = json.loads(header)
    except ValueError:
        return f"{path.name}: its header is not JSON yet"
    expected = 8 + header_len + data_end(tensors, path)
    if size < expected:
        return f"{path.name} has {size} of its {expected} bytes"
    return None


def data_end(tensors: Any, path: Path) -> int:
    """Where the last tensor's data bytes end, by a safetensors header read whole (`tensors`);
    CheckpointDamaged when the header does not say: a header of its full length is not being written."""
    if not isinstance(tensors, dict):
        raise CheckpointDamaged(f"{path}: its header is {type(tensors).__name__}, not a table of tensors")
    end = 0
    for name, entry in tensors.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise CheckpointDamaged(
                f"{path}: its header gives tensor {name!r} no data_offsets [begin, end] (found {offsets!r}): "
                "the file is damaged; save the checkpoint again"
            )
        end = max(end, offsets[1])
    return end


def hf_missing(path: Path) -> str | None:
    if not (path / CONFIG_FILE).is_file():
        return f"no {CONFIG_FILE} yet"
    index = path / HF_INDEX
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, OSError) as exc:
            return f"{HF_INDEX} is not readable yet ({exc})"
    elif (path / HF_SINGLE).is_file():
        names = [HF_SINGLE]
    else:
        return f"no {HF_INDEX} or {HF_SINGLE} yet"
    for name in names:
        shortfall = safetensors_shortfall(path / name)
        if shortfall:
            return shortfall
    return None


def olmo_core_missing(path: Path, needs_config: bool) -> str | None:
    if not (path / OLMO_CORE_WEIGHTS / DCP_METADATA).is_file():
        return f"no {OLMO_CORE_WEIGHTS}/{DCP_METADATA} yet"
    if not (path / OLMO_CORE_MARKER).is_file():
        return f"no {OLMO_CORE_MARKER} (OLMo-core's completion marker) yet"
    if needs_config and not (path / CONFIG_FILE).is_file():
        return f"no {CONFIG_FILE} (written by OLMo-core's ConfigSaverCallback) yet"
    return None


def missing_evidence(checkpoint: Checkpoint, *, needs_config: bool = True) -> str | None:
    """What the checkpoint still lacks of its format's completion evidence; None when it is all there.

    needs_config: an OLMo-core checkpoint must hold the `config.json` its model is built from."""
    if checkpoint.format == HF:
        return hf_missing(checkpoint.path)
    if checkpoint.format == OLMO_CORE:
        return olmo_core_missing(checkpoint.path, needs_config)
    if checkpoint.format == TORCHTITAN:
        return None if (checkpoint.path / DCP_METADATA).is_file() else f"no {DCP_METADATA} yet"
    raise ValueError(f"unknown checkpoint format {checkpoint.format!r}")


@dataclass
class Settling:
    """Tells when each checkpoint has stayed unchanged for `settle_s` seconds with its evidence there.

    seen: checkpoint path -> (its fingerprint, when it was first seen so)."""

    settle_s: float
    seen: dict[Path, tuple[Fingerprint, float]] = field(default_factory=dict)

    def ready(
        self, checkpoint: Checkpoint, now: float, *, needs_config: bool = True, settled: bool = False
    ) -> tuple[bool, str]:
        """(whether `checkpoint` may be read now, why not when it may not). settled: its writer says it is
        finished (a ready event): its evidence suffices, no settle time."""
        missing = missing_evidence(checkpoint, needs_config=needs_config)
        if missing:
            self.seen.pop(checkpoint.path, None)
            return False, missing
        if settled:
            return True, ""
        current = fingerprint(checkpoint.path)
        if current is None:
            self.seen.pop(checkpoint.path, None)
            return False, "gone"
        previous = self.seen.get(checkpoint.path)
        if previous is None or previous[0] != current:
            self.seen[checkpoint.path] = (current, now)
            return self.settle_s <= 0, f"changed; settling for {self.settle_s:g} s"
        waited = now - previous[1]
        if waited >= self.settle_s:
            return True, ""
        return False, f"unchanged for {waited:.1f} of {self.settle_s:g} s"

    def forget(self, checkpoint: Checkpoint) -> None:
        self.seen.pop(checkpoint.path, None)
