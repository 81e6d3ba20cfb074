"""One rank of a job whose nodes each have their own home folder (tests/data/test_perplexity_faults.py), run
by `launch` on the domain files of `lm_helpers.write_domains` in `<work>/data`:

    launch(2, [lm_rank_faults.py, --work DIR, --tokenizer FILE])

`~` is `<work>/node-<rank>`: `~/local.npy` (memmap) and `~/local.jsonl` exist on rank 0's node only, and
`~/flaky.npy` gives an I/O error on rank 1's node. Evaluates (lenient, then strict), then rank 1's files
appear and the lenient evaluator runs again. Writes what it saw to `<work>/rank<r>.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from lm_helpers import lm_entry, tiny_gpt

from inloop_eval.data.tokenizer import load_tokenizer
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator

NODE_FILES = ("local.npy", "local.jsonl", "flaky.npy")


def evaluate(root: Path, rank: int, tokenizer_path: str) -> dict:
    """Lenient, strict (the error it raised), and lenient again once this node's files are there."""
    tokenizer = load_tokenizer(tokenizer_path)
    files = {
        "code": root / "data" / "code",
        "prose": root / "data" / "prose.jsonl",
        "tiny": root / "data" / "tiny.npy",
    }
    entry = lm_entry(files, root / "cache")
    entry["domains"] += [
        {"label": "local_tokens", "paths": ["~/local.npy"]},
        {"label": "local_text", "paths": ["~/local.jsonl"], "format": "jsonl"},
        {"label": "flaky", "paths": ["~/flaky.npy"]},
    ]
    model = tiny_gpt()
    lenient = InLoopEvaluator(EvaluatorConfig(evaluators=[entry]), tokenizer=tokenizer)
    first = lenient.run(model)
    try:
        InLoopEvaluator(EvaluatorConfig(evaluators=[entry], strict=True), tokenizer=tokenizer).run(model)
        strict = "no error"
    except Exception as exc:
        strict = f"{type(exc).__name__}: {exc}"
    if rank == 1:  # the node's files come back
        for name in NODE_FILES:
            (root / "node-1" / name).unlink(missing_ok=True)  # never copy through the link
            shutil.copy(root / "node-0" / name, root / "node-1" / name)
    second = lenient.run(model)
    return {"first": first, "strict": strict, "second": second}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--tokenizer", required=True)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    os.environ["HOME"] = str(args.work / f"node-{rank}")  # `~` in the config is this node's own folder
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    try:
        seen = evaluate(args.work, rank, args.tokenizer)
        (args.work / f"rank{rank}.json").write_text(json.dumps(seen))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
