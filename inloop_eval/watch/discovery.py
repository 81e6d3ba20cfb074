"""Which checkpoints a folder holds: each format's folder name, the training step it carries, its format.

A checkpoint is a sub-folder of the watched folder named as its framework names them, each format's name
declared by its `CheckpointFormat` (`inloop_eval.checkpoints.formats`; e.g. `step<N>`, `checkpoint-<N>`).
Temporary folders frameworks write first (`step<N>-tmp`) match no pattern, so they are never taken for a
checkpoint. The step is the number in the name: the training step the weights are from. Two folders naming
one step (`checkpoint-10` and `checkpoint-00010`) are one step: `one_per_step` keeps the one named as its
framework names it (no leading zeros), else the first by name.
"""

from __future__ import annotations

import re
from pathlib import Path

from inloop_eval.checkpoints.formats import Checkpoint, checkpoint_formats, expected_names
from inloop_eval.errors import InLoopEvalError


class WatchError(InLoopEvalError):
    """The watcher cannot go on: no checkpoint of a known format, a run directory another watcher holds,
    one it cannot write or that was deleted under it."""


class CheckpointUnfit(InLoopEvalError):
    """One checkpoint the config cannot take (a tokenizer that does not fit it, no tokenizer to evaluate it
    with): recorded failed, not tried again under the same config; the watcher goes on to the others."""


def parse_name(name: str) -> tuple[int, str] | None:
    """(step, format) of a checkpoint folder name; None for any other name."""
    for fmt in checkpoint_formats().values():
        step = fmt.step_of(name)
        if step is not None:
            return step, fmt.name
    return None


def discover(folder: Path, formats: tuple[str, ...] | None = None) -> list[Checkpoint]:
    """The checkpoint folders in `folder` (complete or not), by step; [] when `folder` does not exist yet.

    formats: only these formats (None: every format). A folder holding checkpoints of two formats is
    refused: their steps would be mixed on one curve."""
    try:
        entries = sorted(p for p in folder.iterdir() if p.is_dir())
    except FileNotFoundError:
        return []
    except OSError as exc:  # unreadable, or not a folder: waiting would not mend it
        raise WatchError(
            f"watch: cannot list the checkpoint folder {folder} ({type(exc).__name__}: {exc}); pass a folder "
            "this user can read"
        ) from exc
    found = []
    for entry in entries:
        parsed = parse_name(entry.name)
        if parsed is not None and (formats is None or parsed[1] in formats):
            found.append(Checkpoint(step=parsed[0], path=entry, format=parsed[1]))
    kinds = sorted({c.format for c in found})
    if len(kinds) > 1:
        raise WatchError(
            f"watch: {folder} holds checkpoints of several formats ({', '.join(kinds)}); expected one run's "
            "checkpoints of one format: watch each run's own checkpoint folder, or pick one with --format"
        )
    return sorted(found)


def one_per_step(found: list[Checkpoint]) -> tuple[list[Checkpoint], list[list[Checkpoint]]]:
    """One checkpoint per step, and each group of folders naming one step (the one kept first): the one named
    as its framework names it (the step without leading zeros), else the first by name."""
    by_step: dict[int, list[Checkpoint]] = {}
    for checkpoint in found:
        by_step.setdefault(checkpoint.step, []).append(checkpoint)
    kept, groups = [], []
    for _, named in sorted(by_step.items()):
        named.sort(key=lambda c: (not unpadded(c), c.path.name))
        kept.append(named[0])
        if len(named) > 1:
            groups.append(named)
    return kept, groups


def unpadded(checkpoint: Checkpoint) -> bool:
    """Whether the folder's name carries its step without leading zeros, as every framework writes it."""
    digits = re.search(r"\d+$", checkpoint.path.name)
    return digits is not None and digits.group() == str(checkpoint.step)


def refusal_at_start(folder: Path, formats: tuple[str, ...] | None, once: bool) -> str | None:
    """Why a watch of `folder` cannot start (a folder that is not there or holds no checkpoint, with `once`;
    one whose sub-folder holds the checkpoints), or None: said before the run directory is written, so that
    a watch that stops at once leaves nothing behind."""
    if discover(folder, formats) if folder.is_dir() else False:
        return None
    error = str(no_checkpoint_error(folder))
    return error if once or "watch that folder" in error else None


def no_checkpoint_error(folder: Path) -> WatchError:
    """The error for a folder holding no checkpoint of a known format, naming what it holds instead."""
    try:
        names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    except FileNotFoundError:
        return WatchError(
            f"watch: the checkpoint folder {folder} does not exist; pass the folder training saves to"
        )
    shown = ", ".join(names[:8]) + (f", ... ({len(names)} entries)" if len(names) > 8 else "")
    hint = ""
    nested = [n.rstrip("/") for n in names if n.endswith("/") and discover(folder / n.rstrip("/"))]
    if nested:
        hint = f"; {folder / nested[0]} holds checkpoints: watch that folder"
    return WatchError(
        f"watch: {folder} holds no checkpoint of a known format: expected folders named {expected_names()}, "
        f"found {shown or 'nothing'}{hint or '; pass the folder your trainer saves its checkpoints to'}"
    )
