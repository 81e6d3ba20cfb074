"""`inloop-eval watch` in which the safetensors file `$WATCH_TEST_TRUNCATE` names is truncated to half its size
the first time transformers opens it, right after the open: a checkpoint rewritten in place (a writer opening it
"wb", `cp` over it) while the one-process Hugging Face path reads it.

    python tests/support/workers/hf_truncated_read.py CKPT_DIR --config FILE --run-dir DIR --once --settle 0

Both ways transformers opens a safetensors file are intercepted: `open` (its read into memory, the watcher's
`disable_mmap`) and `safe_open` (its map): mapped, the truncated pages would kill the process with SIGBUS when
the tensors are read; read into memory, the read is short. The marker `<file>.truncated` makes it once.
"""

from __future__ import annotations

import builtins
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import transformers.modeling_utils as modeling_utils

from inloop_eval.cli.main import main


def truncating(opener: Callable[..., Any], target: Path) -> Callable[..., Any]:
    """`opener`, truncating `target` to half its size right after it first opens it."""

    def open_then_truncate(file: Any, *args: Any, **kwargs: Any) -> Any:
        handle = opener(file, *args, **kwargs)
        marker = target.with_name(target.name + ".truncated")
        if Path(os.fspath(file)).resolve() == target.resolve() and not marker.exists():
            marker.touch()
            os.truncate(target, target.stat().st_size // 2)
        return handle

    return open_then_truncate


if __name__ == "__main__":
    target = Path(os.environ["WATCH_TEST_TRUNCATE"])
    modeling_utils.open = truncating(builtins.open, target)  # shadows the builtin in that module only
    modeling_utils.safe_open = truncating(modeling_utils.safe_open, target)
    sys.exit(main(["watch", *sys.argv[1:]]))
