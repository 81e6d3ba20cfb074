"""Files already in the local Hugging Face hub cache, found with no network.

The cache is the one `huggingface_hub` writes (`hf download`, `from_pretrained`, `hf_hub_download`):
`<cache>/models--<org>--<name>/refs/main` holds the commit hash `main` pointed to when it was downloaded, and
`snapshots/<hash>/<file>` the file (usually a symlink into `blobs/`). The lookup is huggingface_hub's
`try_to_load_from_cache`, which reads only the filesystem.

The cache folder is read from the environment at each call, as huggingface_hub reads it at import:
`HF_HUB_CACHE`, else the legacy `HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`, else
`$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`. (huggingface_hub's own
`constants.HF_HUB_CACHE` is fixed when it is first imported, so a variable set later would go unseen.)
"""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub import try_to_load_from_cache
from huggingface_hub.utils import HFValidationError


def hub_cache_dir() -> Path:
    """The local Hugging Face hub cache folder the environment names now (it may not exist)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return _expand(os.environ[var])
    if os.environ.get("HF_HOME"):
        return _expand(os.environ["HF_HOME"]) / "hub"
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return _expand(cache_home) / "huggingface" / "hub"


def cached_hub_file(repo_id: str, filename: str, *, cache_dir: Path | None = None) -> Path | None:
    """The path of `filename` of model repository `repo_id` at its cached `main` revision, or None when the
    cache does not hold it (or `repo_id` is not a repository name at all, such as a local path).

    cache_dir: the cache folder; default `hub_cache_dir()`.
    """
    try:
        found = try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir or hub_cache_dir())
    except HFValidationError:
        return None
    # A str is a file; None, or a marker that the file is known to be absent from the repository, is not.
    return Path(found) if isinstance(found, str) else None


def _expand(path: str) -> Path:
    return Path(os.path.expandvars(path)).expanduser()
