"""One rank of a job whose nodes each have their own home folder, on the domain files of
`lm_helpers.write_domains` in `<work>/data` (`$LM_FAULTS_WORK`): the `lm_rank_faults` check of the 2-rank
launch of tests/test_distributed.py (tests/support/workers/world_checks.py).

`~` is `<work>/node-<rank>`: `~/local.npy` (memmap) and `~/local.jsonl` exist on rank 0's node only, and
`~/flaky.npy` gives an I/O error on rank 1's node. Evaluates (lenient, then strict), then rank 1's files
appear and the lenient evaluator runs again.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from lm_helpers import lm_entry, tiny_gpt

from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from workers.dist_checks import Context

NODE_FILES = ("local.npy", "local.jsonl", "flaky.npy")


def check_lm_rank_faults(ctx: Context) -> dict[str, Any]:
    """`evaluate` on `$LM_FAULTS_WORK` with `~` this rank's node folder (`HOME` put back afterwards)."""
    work = Path(os.environ["LM_FAULTS_WORK"])
    home = os.environ.get("HOME")
    os.environ["HOME"] = str(work / f"node-{ctx.rank}")
    try:
        return evaluate(work, ctx.rank, ctx.tokenizer)
    finally:
        if home is None:
            del os.environ["HOME"]
        else:
            os.environ["HOME"] = home


def evaluate(root: Path, rank: int, tokenizer: Any) -> dict[str, Any]:
    """Lenient, strict (the error it raised), and lenient again once this node's files are there."""
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
