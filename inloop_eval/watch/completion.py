"""When a checkpoint has landed: its format's completion evidence, then a settle time without change.

Evidence per format (`missing_evidence`): each format's `missing` (`inloop_eval.checkpoints.formats`) names
the file its framework writes last, or checks that every byte is there (a safetensors file's length against
its own header).

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

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from inloop_eval.checkpoints.formats import Checkpoint, format_of
from inloop_eval.distributed import world

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


def missing_evidence(checkpoint: Checkpoint, *, needs_config: bool = True) -> str | None:
    """What the checkpoint still lacks of its format's completion evidence; None when it is all there.

    needs_config: the model is built from the checkpoint's own config (no `model_builder`), which must be there."""
    return format_of(checkpoint).missing(checkpoint.path, needs_config=needs_config)


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
