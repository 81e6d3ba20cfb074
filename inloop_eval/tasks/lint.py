"""Task lint: problems in choice strings and prompts that silently move scores, found before a run.

Errors (a task with one should not be run): a gold index out of range, an empty choice, a document with a
single choice under figures that compare choices (its accuracy is 1 whatever the model does), a gold choice
identical to a wrong one (scored by position alone), a letter-key task that lists a length normalisation (a
copy of `acc` under another name), a task whose documents fail to load. Warnings (scores are computed, but
likely not as meant): identical wrong choices, whitespace at the end of a choice, leading whitespace on some
choices and not others (within a document or across documents, or doubled after the target delimiter), a
context ending in whitespace (it moves into the continuation), a document given fewer few-shot examples than
asked (its few-shot split has no other documents to replace the ones identical to it).
The summary also gives the spread of choice byte lengths, which says how exposed raw `acc` is to length.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from inloop_eval.errors import InLoopEvalError
from inloop_eval.metrics.formats import LENGTH_NORM_METRICS
from inloop_eval.metrics.registry import comparing_choices
from inloop_eval.tasks.base import Doc, MultipleChoiceTask
from inloop_eval.tasks.loading import load_docs

ERROR = "error"
WARNING = "warning"
_LETTER = re.compile(r"^\s*[A-Z]\s*$")


@dataclass(frozen=True)
class LintIssue:
    """One problem: its severity, a stable code, the document (None for the whole task), a message."""

    severity: str
    code: str
    doc: int | None
    message: str


@dataclass
class LintReport:
    """Every issue of one task and the figures of its summary."""

    task: str
    n_docs: int = 0
    issues: list[LintIssue] = field(default_factory=list)
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def errors(self) -> list[LintIssue]:
        return [i for i in self.issues if i.severity == ERROR]

    @property
    def warnings(self) -> list[LintIssue]:
        return [i for i in self.issues if i.severity == WARNING]

    def codes(self) -> set[str]:
        return {i.code for i in self.issues}

    def summary(self, per_code: int = 3) -> str:
        """A few lines: counts, then each code with its first `per_code` documents, then the length spread."""
        lines = [f"{self.task}: {self.n_docs} docs, {len(self.errors)} errors, {len(self.warnings)} warnings"]
        by_code: dict[tuple[str, str], list[LintIssue]] = {}
        for issue in self.issues:
            by_code.setdefault((issue.severity, issue.code), []).append(issue)
        for (severity, code), issues in sorted(by_code.items(), key=lambda kv: (kv[0][0] != ERROR, kv[0][1])):
            lines.append(f"  {severity} {code} ({len(issues)}x)")
            lines.extend(f"    {i.message}" for i in issues[:per_code])
            if len(issues) > per_code:
                lines.append(f"    ... and {len(issues) - per_code} more")
        s = self.stats
        if s and s["ratio_max"] == 1.0:
            lines.append(
                f"  every choice of a document has the same byte length ({s['bytes_median']:.0f} median)"
            )
        elif s:
            lines.append(
                f"  choice bytes: min {s['bytes_min']:.0f}, median {s['bytes_median']:.0f}, max {s['bytes_max']:.0f}; "
                f"longest/shortest per doc: median {s['ratio_median']:.2f}x, max {s['ratio_max']:.2f}x"
            )
            lines.append(
                f"  gold is the longest choice in {s['gold_longest']:.1%} of docs, the shortest in "
                f"{s['gold_shortest']:.1%} (chance {s['chance']:.1%}): raw acc of always-longest "
                f"{s['gold_longest']:.3f}, always-shortest {s['gold_shortest']:.3f}"
            )
        return "\n".join(lines)


def _is_letter_key_task(task: MultipleChoiceTask, docs: Sequence[Doc]) -> bool:
    if task.prompt_format == "mc":
        return True
    return bool(docs) and all(_LETTER.match(c) for d in docs for c in d.continuations)


# One issue of a document before it is placed: (severity, code, message).
Finding = tuple[str, str, str]


def _doc_issues(task: MultipleChoiceTask, doc: Doc, comparing: Sequence[str]) -> list[LintIssue]:
    findings = [
        *_choice_issues(doc, comparing),
        *_duplicate_choice_issues(doc),
        *_leading_whitespace_issues(task, doc),
        *_prompt_issues(task, doc),
    ]
    return [
        LintIssue(severity, code, doc.index, f"doc {doc.index}: {message}")
        for severity, code, message in findings
    ]


def _choice_issues(doc: Doc, comparing: Sequence[str]) -> list[Finding]:
    """Too few choices for the figures `comparing` them, a gold out of range, an empty or padded choice."""
    out: list[Finding] = []
    if doc.n_choices < 2 and comparing:
        out.append(
            (
                ERROR,
                "single-choice",
                f"{doc.n_choices} choice: {list(comparing)} weigh a document's choices against each other, so each "
                "is perfect on this document whatever the model does; expected at least 2 choices",
            )
        )
    bad_gold = [g for g in doc.gold if not 0 <= g < doc.n_choices]
    if bad_gold or not doc.gold:
        out.append(
            (
                ERROR,
                "gold-out-of-range",
                f"gold {list(doc.gold)}: expected indices from 0 to {doc.n_choices - 1}",
            )
        )
    for i, choice in enumerate(doc.continuations):
        if not choice.strip():
            out.append((ERROR, "empty-choice", f"choice {i}: expected text, found {choice!r}"))
        elif choice != choice.rstrip():
            out.append(
                (WARNING, "choice-trailing-whitespace", f"choice {i} ends in whitespace: {choice[-20:]!r}")
            )
    return out


def _duplicate_choice_issues(doc: Doc) -> list[Finding]:
    """Choices that are the same request: an error when the gold ties with a wrong choice."""
    out: list[Finding] = []
    pairs = list(zip(doc.contexts, doc.continuations, strict=True))
    for pair, count in Counter(pairs).items():
        if count < 2:
            continue
        same = [i for i, p in enumerate(pairs) if p == pair]
        golds = [i for i in same if i in doc.gold]
        if 0 < len(golds) < len(same):  # the gold ties with a wrong choice: scored by position alone
            message = f"choices {same} are the same request {pair[1]!r}, gold {golds} among them"
            out.append((ERROR, "duplicate-choice", message))
        else:
            out.append((WARNING, "duplicate-choice", f"choices {same} are the same request {pair[1]!r}"))
    return out


def _leading_whitespace_issues(task: MultipleChoiceTask, doc: Doc) -> list[Finding]:
    """Choices of which only some start with whitespace, or all do after a delimiter ending in it."""
    leading = [c[:1].isspace() for c in doc.continuations if c]
    if 0 < sum(leading) < len(leading):
        spaced = [i for i, c in enumerate(doc.continuations) if c[:1].isspace()]
        return [
            (
                WARNING,
                "choice-leading-whitespace",
                f"choices {spaced} start with whitespace and the others do not",
            )
        ]
    if leading and all(leading) and task.target_delimiter[-1:].isspace():
        message = f"every choice starts with whitespace after the target delimiter {task.target_delimiter!r}: doubled"
        return [(WARNING, "choice-leading-whitespace", message)]
    return []


def _prompt_issues(task: MultipleChoiceTask, doc: Doc) -> list[Finding]:
    """Fewer few-shot examples than the task asks for, a context ending in whitespace."""
    out: list[Finding] = []
    if doc.shots < task.num_fewshot:
        out.append(
            (
                WARNING,
                "fewer-shots",
                f"{doc.shots} few-shot examples, expected {task.num_fewshot}: the few-shot split has no other "
                "documents to replace the ones identical to this one",
            )
        )
    for context in dict.fromkeys(doc.contexts):
        if context != context.rstrip():
            out.append(
                (
                    WARNING,
                    "context-trailing-whitespace",
                    f"context ends in whitespace ({context[-15:]!r}); it is moved to the front of the continuation",
                )
            )
    return out


def _length_stats(docs: Sequence[Doc]) -> dict[str, float]:
    sizes = [len(c.encode("utf-8")) for d in docs for c in d.continuations]
    ratios, longest, shortest = [], 0, 0
    for d in docs:
        lengths = [len(c.encode("utf-8")) for c in d.continuations]
        if len(set(d.continuations)) < 2 or not d.gold or not all(0 <= g < d.n_choices for g in d.gold):
            continue
        ratios.append(max(lengths) / max(min(lengths), 1))
        gold = lengths[d.gold[0]]
        longest += gold == max(lengths) and lengths.count(gold) == 1
        shortest += gold == min(lengths) and lengths.count(gold) == 1
    if not sizes or not ratios:
        return {}
    n = len(ratios)
    return {
        "bytes_min": float(min(sizes)),
        "bytes_median": float(statistics.median(sizes)),
        "bytes_max": float(max(sizes)),
        "ratio_median": float(statistics.median(ratios)),
        "ratio_max": float(max(ratios)),
        "gold_longest": longest / n,
        "gold_shortest": shortest / n,
        "chance": statistics.mean(1 / d.n_choices for d in docs if d.n_choices),
    }


def lint_docs(
    task: MultipleChoiceTask, docs: Sequence[Doc], metrics: Sequence[str] | None = None
) -> LintReport:
    """Check rendered documents (and the metrics the task reports, default `task.metrics`)."""
    report = LintReport(task.name, n_docs=len(docs))
    metrics = task.metrics if metrics is None else metrics
    listed = [m for m in LENGTH_NORM_METRICS if m in metrics]
    if listed and _is_letter_key_task(task, docs):
        report.issues.append(
            LintIssue(
                ERROR,
                "length-norm-on-letter-keys",
                None,
                f"letter-key task lists {listed}: every choice has the same length, so each is a copy of acc",
            )
        )
    comparing = comparing_choices(metrics)
    for doc in docs:
        report.issues.extend(_doc_issues(task, doc, comparing))
    spaced = [all(c[:1].isspace() for c in d.continuations) for d in docs if d.continuations]
    if 0 < sum(spaced) < len(spaced):
        report.issues.append(
            LintIssue(
                WARNING,
                "leading-whitespace-across-docs",
                None,
                f"the choices of {sum(spaced)} of {len(spaced)} documents start with whitespace, the others' do not",
            )
        )
    report.stats = _length_stats(docs)
    return report


def lint_task(
    task: MultipleChoiceTask, data_root: str | Path | None = None, limit: int | None = None
) -> LintReport:
    """Load a task's documents and check them; a load failure is reported as an error, not raised."""
    try:
        docs = load_docs(task, data_root, limit)
    except InLoopEvalError as exc:
        report = LintReport(task.name)
        report.issues.append(LintIssue(ERROR, "load-failed", None, str(exc)))
        return report
    return lint_docs(task, docs)
