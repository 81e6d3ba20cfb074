"""`inloop-eval tasks --describe TASK`: a task's settings and one rendered request, as it will be scored."""

from __future__ import annotations

from pathlib import Path

from inloop_eval.errors import TaskDataError
from inloop_eval.requests.tokenize import move_trailing_whitespace
from inloop_eval.tasks.base import MultipleChoiceTask
from inloop_eval.tasks.loading import load_docs


def _block(title: str, text: str) -> list[str]:
    return [f"--- {title} ---", text, f"--- end of {title} ({len(text)} characters) ---"]


def describe_task(task: MultipleChoiceTask, data_root: str | Path | None = None, doc: int = 0) -> str:
    """Settings, then document `doc` as requests: the context and each continuation as scored (the target
    delimiter included; with the harness's pair encoding the context's trailing whitespace moved over, as
    `build_requests` does), and the document's own unconditional contexts where it has them (OLMo's)."""

    docs = load_docs(task, data_root, doc + 1)
    if len(docs) <= doc:
        raise TaskDataError(f"task {task.name!r}: expected a document {doc}, found {len(docs)} documents")
    d = docs[doc]
    lines = [
        f"task: {task.name}",
        f"format: {task.prompt_format}" + (f" ({task.format_source})" if task.format_source else ""),
        f"metrics: {', '.join(task.metrics)}",
        f"target delimiter: {task.target_delimiter!r}",
        f"pair encoding: {task.pair_encoding}",
        f"unconditional context (PMI): {task.uncond_context or '<BOS, else EOS>'!r}",
    ]
    if task.olmo_metric_type:
        lines.append(f"OLMo metric type: {task.olmo_metric_type}")
    if task.num_fewshot:
        source = task.fewshot_split or f"{task.split} (the document itself excluded)"
        lines.append(
            f"few-shot: {task.num_fewshot} examples, {task.fewshot_sampler} from {source}, "
            f"delimiter {task.fewshot_delimiter!r}, seed {task.fewshot_seed}"
        )
    lines.append(f"document {d.index}: {d.n_choices} choices, gold {list(d.gold)}")
    shared = len(set(d.contexts)) == 1
    for i, (context, choice) in enumerate(zip(d.contexts, d.continuations, strict=True)):
        ctx, cont = context, task.target_delimiter + choice
        if task.pair_encoding != "olmo":
            ctx, cont = move_trailing_whitespace(ctx, cont)
        if shared and i == 0:
            lines += _block("context", ctx)
        elif not shared:
            lines += _block(f"context of choice {i}", ctx)
        mark = "*" if i in d.gold else " "
        lines.append(f"{mark} choice {i}: {cont!r}" + ("  (gold)" if i in d.gold else ""))
        if d.uncond_contexts:
            lines.append(f"  unconditional context of choice {i}: {d.uncond_contexts[i]!r}")
    return "\n".join(lines)
