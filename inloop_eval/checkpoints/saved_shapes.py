"""A distributed checkpoint holding a tensor of another shape than the model it is read into, in the watcher's
terms: torch.distributed.checkpoint refuses it while planning the read (a `ValueError`, wrapped per rank in a
`CheckpointException` under torchrun) naming the tensor and both sizes, but not the checkpoint; `shape_mismatch`
turns that refusal into `CheckpointDamaged` naming the tensor, the shape saved (read back from the checkpoint's
`.metadata`), the shape the model holds and the folder, so that the step is recorded failed with that reason
and tried again once its files change (a checkpoint saved again, or a config put right), not refused for
good. Any other error is left as it is.
"""

from __future__ import annotations

import re
from pathlib import Path

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from inloop_eval.checkpoints.formats import Checkpoint, CheckpointDamaged, format_of

# torch.distributed.checkpoint's refusal (`default_planner.create_default_local_load_plan`).
_SIZE_MISMATCH = re.compile(
    r"Size mismatch between saved torch\.Size\(\[(?P<saved>[\d, ]*)\]\) and current: "
    r"torch\.Size\(\[(?P<current>[\d, ]*)\]\) for (?P<name>\S+)"
)


def shape_mismatch(error: BaseException, checkpoint: Checkpoint) -> CheckpointDamaged | None:
    """CheckpointDamaged naming the tensor, its saved and expected shapes and the checkpoint's folder, when
    `error` (raised reading `checkpoint`) is torch.distributed.checkpoint's refusal of a tensor saved with
    another shape; None for any other error."""
    found = next((m for e in _errors(error) if (m := _SIZE_MISMATCH.search(str(e)))), None)
    if found is None:
        return None
    name = found["name"]
    folder = format_of(checkpoint).weights(checkpoint.path)
    saved = _saved_shape(folder, name) or [int(n) for n in found["saved"].split(",") if n.strip()]
    expected = [int(n) for n in found["current"].split(",") if n.strip()]
    return CheckpointDamaged(
        f"{folder}: tensor {name!r} is saved with shape {saved}, but the model it is read into holds "
        f"{expected} (a checkpoint of another model than its config or --model-builder builds)"
    )


def _errors(error: BaseException) -> list[BaseException]:
    """`error` and, for a `CheckpointException`, each rank's failure it wraps."""
    found = [error]
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict):
        for failure in failures.values():
            inner = failure[0] if isinstance(failure, tuple) and failure else failure
            if isinstance(inner, BaseException):
                found.append(inner)
    return found


def _saved_shape(folder: Path, name: str) -> list[int] | None:
    """The shape `folder`'s `.metadata` records for tensor `name`; None if it cannot be read."""
    try:
        entry = FileSystemReader(str(folder)).read_metadata().state_dict_metadata.get(name)
    except (OSError, ValueError, EOFError, AttributeError, ImportError, RuntimeError):  # unpickling a damaged file
        return None  # the refusal's own figure stands in
        return None
    return list(entry.size) if isinstance(entry, TensorStorageMetadata) else None
