"""Where task data lives: a local root in OLMo's `save_to_disk` layout, else the Hugging Face hub.

Layout: `<root>/<dataset path>/<dataset name or "none">/<split>`, each a directory written by
`datasets.Dataset.save_to_disk`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from inloop_eval.errors import TaskDataError

if TYPE_CHECKING:
    import datasets

OE_EVAL_DIR = "oe_eval_tasks"
TOKENIZER_DIR = "tokenizers"


def home() -> Path:
    """`$INLOOP_EVAL_HOME`, else `~/.cache/inloop_eval`: data, caches and downloads live under it."""
    return Path(os.environ.get("INLOOP_EVAL_HOME", "~/.cache/inloop_eval")).expanduser()


def default_data_root() -> Path:
    """`$INLOOP_EVAL_DATA`, else `<home>/data`."""
    env = os.environ.get("INLOOP_EVAL_DATA")
    return Path(env).expanduser() if env else home() / "data"


def oe_eval_dir(root: str | Path) -> Path:
    """OLMo's oe-eval request files inside a fetched data root: `<task>/<variant>/requests.jsonl.gz`."""
    return Path(root) / OE_EVAL_DIR


def neox_tokenizer_path(root: str | Path) -> Path:
    """The GPT-NeoX-20B tokenizer (with OLMo's PII special tokens) inside a fetched data root."""
    return Path(root) / TOKENIZER_DIR / "gpt-neox-20b.json"


def split_dir(root: str | Path, path: str, name: str | None, split: str) -> Path:
    return Path(root) / path / (name or "none") / split


def load_split(
    path: str,
    name: str | None,
    split: str,
    *,
    data_root: str | Path | None = None,
    task: str = "",
    allow_hub: bool = False,
) -> datasets.Dataset:
    """Load one split from the local root; from the hub only when `allow_hub` (never during training)."""
    import datasets

    root = Path(data_root) if data_root is not None else default_data_root()
    local = split_dir(root, path, name, split)
    if local.is_dir():
        return datasets.load_from_disk(str(local))
    if allow_hub:
        try:
            return datasets.load_dataset(path, name, split=split)
        except Exception as exc:  # the hub raises many types; all mean "not available"
            raise TaskDataError(
                f"task {task!r}: data not found at {local} and the hub gave {type(exc).__name__}: {exc}; "
                "run `inloop-eval data fetch --root DIR` on a machine with network access"
            ) from None
    raise TaskDataError(
        f"task {task!r}: expected the split {path}/{name or 'none'}/{split} under the data root {root}, "
        f"found no directory {local}; run `inloop-eval data fetch --root {root}` first "
        "(or set INLOOP_EVAL_DATA / `data_root` to where the data is)"
    )
