"""What a multiple-choice task is: documents of contexts, continuations and gold answers.

A task turns raw dataset rows into `Doc`s. Every request of a document is one (context, continuation)
pair; the continuation string scored is `target_delimiter + continuation`, and length normalisation uses
the continuation without the delimiter (as lm-evaluation-harness does).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inloop_eval.data.root import split_rows
from inloop_eval.errors import TaskDataError
from inloop_eval.metrics.formats import RC_METRICS


@dataclass(frozen=True)
class Doc:
    """One question, expanded to one (context, continuation) pair per choice.

    index: position of the document in the task's (concatenated) split.
    contexts: one context string per choice (the same string repeated when the context is shared).
    continuations: one continuation per choice, without the target delimiter.
    gold: indices of the correct choices (usually one).
    shots: the number of few-shot examples put before its prompt (fewer than the task's `num_fewshot`
        only where the few-shot split holds too few documents other than this one, see `tasks.fewshot`).
    uncond_contexts: one unconditional (PMI) context per choice where it depends on the document (OLMo's
        domain conditionals, e.g. HellaSwag's `ctx_b`); empty: the task's `uncond_context` for every choice.
    """

    index: int
    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    gold: tuple[int, ...]
    shots: int = 0
    uncond_contexts: tuple[str, ...] = ()

    @property
    def n_choices(self) -> int:
        return len(self.continuations)


def shown(value: Any, limit: int = 60) -> str:
    """A value for an error message, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def get_field(task: str, index: int, raw: Mapping[str, Any], name: str) -> Any:
    """`raw[name]`, or a TaskDataError naming the task, document and field."""
    try:
        return raw[name]
    except (KeyError, TypeError):
        found = ", ".join(sorted(raw)) if isinstance(raw, Mapping) else type(raw).__name__
        raise TaskDataError(
            f"task {task!r} doc {index}: missing field {name!r} (found fields: {found})"
        ) from None


class MultipleChoiceTask:
    """A multiple-choice task scored by loglikelihood (zero-shot unless `num_fewshot` is set).

    Subclasses set the class attributes and implement `doc_to_context`, `doc_to_continuations` and
    `doc_to_gold`; `make_doc` checks the result.
    """

    name: str = ""
    dataset_path: str = ""
    # One subset name, several (documents are concatenated in this order), or None.
    dataset_name: str | tuple[str, ...] | None = None
    split: str = "validation"
    # "rc" (answer text as continuation), "mc" (letter keys), "partial" (option in the context),
    # "classification" (label words, scored with f1) or "gold" (the answer alone, for ce/bpb).
    prompt_format: str = "rc"
    target_delimiter: str = " "
    # Context of the unconditional request for PMI; "" means the tokenizer's BOS (or EOS) token alone.
    uncond_context: str = ""
    # How a (context, continuation) pair becomes tokens (see `inloop_eval.requests.tokenize`): "harness" (split at the
    # common prefix of context and context + continuation) or "olmo" (OLMo's in-loop tasks: each encoded
    # on its own, exactly as given).
    pair_encoding: str = "harness"
    # OLMo's metric type (acc, len_norm, pmi_dc, ce_loss, bpb, f1) for tasks that reproduce one of OLMo's
    # labels (`olmo:<label>`): their OLMo figures (`inloop_eval.metrics.olmo`) are reported beside ours.
    olmo_metric_type: str | None = None
    metrics: tuple[str, ...] = RC_METRICS
    # Which published format the prompt follows; shown by `inloop-eval tasks`.
    format_source: str = ""
    # Few-shot examples put before every prompt (see `inloop_eval.tasks.fewshot`); an id suffix
    # `_<k>shot` sets `num_fewshot` (`arc_easy_rc_5shot`).
    num_fewshot: int = 0
    supports_fewshot: bool = True
    # Split the examples come from; None: the evaluated split itself, the document excluded.
    fewshot_split: str | None = None
    # "first_n": the split's first k documents (as MMLU's dev split is used); "random": k drawn per
    # document from a generator seeded by (fewshot_seed, subset, document index).
    fewshot_sampler: str = "random"
    fewshot_seed: int = 1234
    # Between examples, and between the last example and the prompt.
    fewshot_delimiter: str = "\n\n"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str | Sequence[str]:
        """The prompt, or one prompt per choice (partial scoring)."""
        raise NotImplementedError

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> Sequence[str]:
        """Candidate continuations without the target delimiter (one, if shared by per-choice contexts)."""
        raise NotImplementedError

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int | str | Sequence[int]:
        """Index of the gold choice, several indices, or the gold continuation string."""
        raise NotImplementedError

    def field(self, raw: Mapping[str, Any], index: int, name: str) -> Any:
        return get_field(self.name, index, raw, name)

    def error(self, index: int, message: str) -> TaskDataError:
        return TaskDataError(f"task {self.name!r} doc {index}: {message}")

    def text(self, raw: Mapping[str, Any], index: int, name: str, *, nonempty: bool = False) -> str:
        """`raw[name]`, which must be a string (with more than whitespace when `nonempty`, as for a choice)."""
        value = self.field(raw, index, name)
        if not isinstance(value, str):
            raise self.error(
                index, f"field {name!r}: expected a string, found {type(value).__name__} {shown(value)}"
            )
        if nonempty and not value.strip():
            raise self.error(index, f"field {name!r}: expected a non-empty choice, found {value!r}")
        return value

    def texts(self, raw: Mapping[str, Any], index: int, name: str, *, nonempty: bool = False) -> list[str]:
        """`raw[name]`, which must be a list of strings (each with more than whitespace when `nonempty`)."""
        value = self.field(raw, index, name)
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise self.error(index, f"field {name!r}: expected a list of strings, found {shown(value)}")
        if nonempty:
            for i, text in enumerate(value):
                if not text.strip():
                    raise self.error(
                        index, f"field {name!r}: expected non-empty choices, found choice {i} {text!r}"
                    )
        return list(value)

    def label(
        self,
        raw: Mapping[str, Any],
        index: int,
        name: str,
        n_choices: int,
        *,
        first: int = 0,
    ) -> int:
        """The 0-based choice index in `raw[name]`: an integer, or a numeral string, counting from `first`."""
        value = self.field(raw, index, name)
        expected = f"an integer label from {first} to {first + n_choices - 1}"
        number: int | None = None
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            number = int(value)
        elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
            number = int(value.strip())
        if number is None:
            raise self.error(index, f"field {name!r}: expected {expected}, found {shown(value)}")
        if not first <= number < first + n_choices:
            raise self.error(
                index,
                f"field {name!r}: label out of range for {n_choices} choices: expected {expected}, found {shown(value)}",
            )
        return number - first

    def description_for(self, raw: Mapping[str, Any], subset: str | None) -> str:
        """Text put before the examples and the prompt (a task's instruction); none by default."""
        return ""

    def subsets(self) -> tuple[str | None, ...]:
        """The dataset subsets whose splits are concatenated, in order."""
        return self.dataset_name if isinstance(self.dataset_name, tuple) else (self.dataset_name,)

    @property
    def length_norm_is_noop(self) -> bool:
        return self.prompt_format in ("mc", "partial")

    def rows(
        self, subset: str | None, split: str, data_root: str | Path | None
    ) -> Sequence[Mapping[str, Any]]:
        """The raw rows of one subset's split, each made into a document by `make_doc` (see
        `inloop_eval.tasks.loading`); by default the split saved under the data root."""
        return split_rows(self.dataset_path, subset, split, data_root=data_root, task=self.name)

    def make_doc(self, raw: Mapping[str, Any], index: int) -> Doc:
        """Render and check one raw row; raises TaskDataError naming the task, document and field."""
        context = self.doc_to_context(raw, index)
        continuations = [str(c) for c in self.doc_to_continuations(raw, index)]
        contexts = [context] if isinstance(context, str) else [str(c) for c in context]
        if not continuations:
            raise self.error(index, "field 'choices': expected at least 1 choice, found none")
        if len(contexts) > 1 and len(continuations) == 1:
            continuations = continuations * len(contexts)
        if len(contexts) == 1:
            contexts = contexts * len(continuations)
        if len(contexts) != len(continuations):
            raise self.error(
                index,
                f"expected one context per choice, found {len(contexts)} contexts "
                f"for {len(continuations)} choices",
            )
        for i, cont in enumerate(continuations):
            if not cont.strip():
                raise self.error(index, f"field 'choices': choice {i} is empty ({cont!r})")
        gold = self._gold_indices(self.doc_to_gold(raw, index), continuations, index)
        return Doc(index, tuple(contexts), tuple(continuations), gold)

    def _gold_indices(self, gold: Any, continuations: list[str], index: int) -> tuple[int, ...]:
        if isinstance(gold, str):
            if gold not in continuations:
                raise self.error(
                    index, f"field 'gold': gold string {gold!r} is not among the choices {continuations!r}"
                )
            return (continuations.index(gold),)
        golds = list(gold) if isinstance(gold, (list, tuple)) else [gold]
        if not golds:
            raise self.error(index, "field 'gold': expected at least one gold answer, found none")
        out = []
        for g in golds:
            if isinstance(g, bool) or not isinstance(g, numbers.Integral):
                raise self.error(index, f"field 'gold': expected an integer index, found {g!r}")
            if not 0 <= g < len(continuations):
                raise self.error(
                    index, f"field 'gold': label {g} out of range for {len(continuations)} choices"
                )
            out.append(int(g))
        return tuple(sorted(set(out)))
