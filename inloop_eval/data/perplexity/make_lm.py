"""`inloop-eval data make-lm`: domain sets for perplexity evaluation made from local text.

Documents come from files matched by globs or from the passages of fetched oe-eval request files; a seeded
choice of whole documents is written as OLMo-style token files or as JSONL (see `make_domain_set`).
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import shutil
from collections.abc import Iterable
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import numpy as np

from inloop_eval.data.files import build_directory_atomically
from inloop_eval.data.root import oe_eval_dir
from inloop_eval.data.tokenizer import TokenizerLike, encode_texts
from inloop_eval.errors import LMDataError

# oe-eval request files (in a fetched data root) whose passages make an English prose domain; none of
# them is the demo's training text (CoQA, DROP, SQuAD). LAMBADA: passages of unpublished novels.
OE_EVAL_PASSAGES: dict[str, str] = {"lambada": "lambada/bpb_0shot/requests.jsonl.gz"}


def glob_documents(patterns: Iterable[str], exclude: Iterable[str] = ()) -> tuple[list[tuple[str, str]], int]:
    """(path, text) of every UTF-8 file the globs match, minus `exclude` globs (fnmatch on the path), and
    how many files were skipped as not UTF-8."""
    excluded = list(exclude)
    docs: list[tuple[str, str]] = []
    skipped = 0
    for path in sorted(
        {p for pattern in patterns for p in glob.glob(os.path.expanduser(pattern), recursive=True)}
    ):
        if not Path(path).is_file() or any(fnmatch(path, x) for x in excluded):
            continue
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            skipped += 1
            continue
        if text.strip():
            docs.append((path, text))
    return docs, skipped


def oe_eval_passages(root: str | Path, task: str) -> list[tuple[str, str]]:
    """(source, passage) of the unique passages of an oe-eval request file: each request's context and
    continuation together (for LAMBADA, the whole passage with its last word)."""
    if task not in OE_EVAL_PASSAGES:
        raise LMDataError(f"make-lm: --oe-eval {task!r} is not known; choose from {sorted(OE_EVAL_PASSAGES)}")
    path = oe_eval_dir(root) / OE_EVAL_PASSAGES[task]
    if not path.is_file():
        raise LMDataError(f"make-lm: {path} does not exist; run `inloop-eval data fetch --root {root}` first")
    seen: dict[str, None] = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            request = json.loads(line)["request"]
            text = (request["context"] + request["continuation"]).strip()
            if text:
                seen.setdefault(text, None)
    return [(f"{task}:{i}", text) for i, text in enumerate(seen)]


def make_domain_set(
    documents: list[tuple[str, str]],
    tokenizer: TokenizerLike,
    out: Path,
    *,
    label: str,
    fmt: str = "memmap",
    max_tokens: int | None = None,
    tokens_per_file: int = 500_000,
    seed: int = 0,
    sources: Iterable[str] = (),
) -> dict[str, Any]:
    """Write a domain set to `out/<label>/` and return its manifest (also written as `manifest.json`).

    documents: (source, text) pairs; a seeded shuffle of them is taken whole until `max_tokens` tokens.
    fmt: `memmap` writes OLMo-style raw token files `part-00000.npy`, ... (uint16 when the vocabulary fits,
        else uint32), each document followed by EOS, at most `tokens_per_file` tokens a file; `jsonl` writes
        `docs.jsonl` with `text` and `source` fields. `documents.txt` lists the source of each document.
    sources: what the documents were made from (globs, oe-eval names), for the manifest.
    """
    if not documents:
        raise LMDataError(f"make-lm: label {label!r} has no documents; check --glob / --oe-eval")
    chosen = choose_documents(documents, tokenizer, max_tokens, seed)
    vocab = int(getattr(tokenizer, "vocab_size", 0) or max(max(ids) for _, _, ids in chosen) + 1)
    dtype = np.uint16 if vocab <= 2**16 else np.uint32
    manifest: dict[str, Any] = {
        "label": label,
        "format": fmt,
        "dtype": np.dtype(dtype).name if fmt == "memmap" else None,
        "n_documents": len(chosen),
        "n_tokens": sum(len(ids) for _, _, ids in chosen),
        "n_bytes": sum(len(text.encode("utf-8")) for _, text, _ in chosen),
        "tokenizer": str(getattr(tokenizer, "name", "") or type(tokenizer).__name__),
        "seed": seed,
        "sources": list(sources),
    }

    def build(staging: Path) -> None:
        if fmt == "memmap":
            write_token_files(
                chosen, staging, dtype, getattr(tokenizer, "eos_token_id", None), tokens_per_file
            )
        else:
            write_documents_jsonl(chosen, staging)
        (staging / "documents.txt").write_text("".join(f"{source}\n" for source, _, _ in chosen))
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=1))

    target = out / label
    if target.exists():
        shutil.rmtree(target)
    build_directory_atomically(target, build)
    return manifest


def choose_documents(
    documents: list[tuple[str, str]], tokenizer: TokenizerLike, max_tokens: int | None, seed: int
) -> list[tuple[str, str, list[int]]]:
    """(source, text, token ids) of a seeded shuffle of `documents`, taken whole until `max_tokens` tokens
    (documents with no tokens left out); tokenized 64 at a time, so no more than needed are."""
    order = np.random.default_rng(seed).permutation(len(documents))
    chosen: list[tuple[str, str, list[int]]] = []
    total = 0
    for lo in range(0, len(order), 64):
        picked = [documents[int(i)] for i in order[lo : lo + 64]]
        for (source, text), ids in zip(picked, encode_texts(tokenizer, [t for _, t in picked]), strict=True):
            if ids and (max_tokens is None or total < max_tokens):
                chosen.append((source, text, ids))
                total += len(ids)
        if max_tokens is not None and total >= max_tokens:
            break
    return chosen


def write_token_files(
    chosen: list[tuple[str, str, list[int]]],
    staging: Path,
    dtype: type[np.unsignedinteger],
    eos: int | None,
    tokens_per_file: int,
) -> None:
    """OLMo-style raw token files `part-00000.npy`, ...: each document followed by EOS (when the tokenizer
    has one), at most `tokens_per_file` tokens a file."""
    stream = np.concatenate(
        [np.asarray(ids + ([eos] if eos is not None else []), dtype=np.int64) for _, _, ids in chosen]
    ).astype(dtype)
    for k, lo in enumerate(range(0, len(stream), tokens_per_file)):
        stream[lo : lo + tokens_per_file].tofile(staging / f"part-{k:05d}.npy")


def write_documents_jsonl(chosen: list[tuple[str, str, list[int]]], staging: Path) -> None:
    """`docs.jsonl`: one line per document with its `text` and `source`."""
    with (staging / "docs.jsonl").open("w", encoding="utf-8") as f:
        for source, text, _ in chosen:
            f.write(json.dumps({"text": text, "source": source}, ensure_ascii=False) + "\n")
