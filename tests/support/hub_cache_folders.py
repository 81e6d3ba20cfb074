"""A local Hugging Face hub cache built by hand, laid out as `huggingface_hub` lays it out, and a tokenizer
file as wide as OLMo's dolma2 vocabulary."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_to_hub_cache(
    cache: Path, repo_id: str, filename: str, content: bytes, *, commit: str = COMMIT
) -> Path:
    """Put `content` in `cache` as `filename` of model repository `repo_id` at `main`, the way
    `hf download` does: `models--<org>--<name>/refs/main` holds `commit`, `snapshots/<commit>/<filename>`
    is a relative symlink to `blobs/<sha256>`. Returns the snapshot path."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(content)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)  # no newline, as huggingface_hub writes it
    snapshot = repo / "snapshots" / commit / filename
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.symlink_to(Path("..", "..", "blobs", blob.name))
    return snapshot


def widened_tokenizer_json(tokenizer_file: Path, vocab_size: int) -> bytes:
    """`tokenizer_file` (a BPE `tokenizers` JSON) with filler tokens appended to its vocabulary up to
    `vocab_size` ids; it encodes text as before."""
    data = json.loads(tokenizer_file.read_text())
    vocab = data["model"]["vocab"]
    first_free = 1 + max([*vocab.values(), *(token["id"] for token in data.get("added_tokens", []))])
    for token_id in range(first_free, vocab_size):
        vocab[f"<|filler_{token_id}|>"] = token_id
    return json.dumps(data).encode()
