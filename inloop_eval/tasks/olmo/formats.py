"""OLMo's own in-loop task formats (ai2-olmo-eval 0.9.0, `olmo_eval/tasks.py`), rendered as OLMo renders them.

`OLMoTask` is what every `olmo:<label>` task shares: requests encoded as OLMo encodes them (the context and
the continuation each on their own, see `inloop_eval.requests.pairs.tokenize_pair_olmo`), each choice's unconditional
context OLMo's domain conditional (encoded without BOS), and the metric type OLMo scores the label with in
`olmo_metric_type`. The classes below are OLMo's hand-written formats (piqa, hellaswag, ..., the CE-loss
answer tasks); OLMo's MMLU is in `olmo_mmlu`, its oe-eval request files in `olmo_oe_eval`.

Every continuation OLMo scores starts with a space: here that space is the target delimiter and the
choices are stored without it, so `target_delimiter + choice` is OLMo's continuation string.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from inloop_eval.errors import UnknownTaskError
from inloop_eval.metrics.registry import (
    CLASSIFICATION_METRICS,
    GOLD_ONLY_METRICS,
    MC_METRICS,
    PARTIAL_METRICS,
    RC_METRICS,
)
from inloop_eval.tasks.base import Doc, MultipleChoiceTask
from inloop_eval.tasks.native.hellaswag import preprocess as hellaswag_preprocess

# The metric types of OLMo's `ICLMetric`; ce_loss and bpb score the gold continuation alone.
OLMO_METRIC_TYPES: tuple[str, ...] = ("acc", "len_norm", "pmi_dc", "ce_loss", "bpb", "f1")
GOLD_ONLY_TYPES: tuple[str, ...] = ("ce_loss", "bpb")
# OLMo's domain conditional where a task names none (`ICLMultiChoiceTaskDataset.doc_to_domain_conditional`).
DEFAULT_DOMAIN_CONDITIONAL = " "

_METRICS_BY_FORMAT: dict[str, tuple[str, ...]] = {
    "rc": RC_METRICS,
    "mc": MC_METRICS,
    "partial": PARTIAL_METRICS,
    "classification": CLASSIFICATION_METRICS,
    "gold": GOLD_ONLY_METRICS,
}


def check_metric_type(label: str, metric_type: str) -> str:
    """`metric_type` if it is one of OLMo's, else UnknownTaskError naming the label."""
    if metric_type not in OLMO_METRIC_TYPES:
        raise UnknownTaskError(
            f"OLMo label {label!r}: metric type expected one of {OLMO_METRIC_TYPES}, found {metric_type!r}"
        )
    return metric_type


def metrics_for(prompt_format: str, metric_type: str) -> tuple[str, ...]:
    """The figures a task of this format reports; PMI is added where OLMo scores the label by pmi_dc."""
    metrics = _METRICS_BY_FORMAT[prompt_format]
    if metric_type == "pmi_dc" and "acc_pmi" not in metrics:
        metrics = (*metrics, "acc_pmi")
    return metrics


def with_metric_type(format_source: str, metric_type: str) -> str:
    """A task's format line for `inloop-eval tasks`, naming OLMo's metric type of its label."""
    return f"{format_source}; OLMo metric type {metric_type}"


class OLMoTask(MultipleChoiceTask):
    """A task in OLMo's own format: subclasses render the prompt, the choices (without OLMo's leading space),
    the gold index and `doc_to_uncond`, OLMo's domain conditional."""

    pair_encoding = "olmo"
    supports_fewshot = False  # OLMo's few-shot prompts are part of the label (`olmo:mmlu_stem_mc_5shot`)
    uncond_context = DEFAULT_DOMAIN_CONDITIONAL
    # OLMo's default metric type for the format; an `olmo:` label may override it.
    olmo_metric_type: str = "acc"

    def __init__(self, metric_type: str | None = None) -> None:
        if metric_type is not None:
            self.olmo_metric_type = metric_type
        if self.olmo_metric_type in GOLD_ONLY_TYPES:
            self.prompt_format = "gold"
        self.metrics = metrics_for(self.prompt_format, self.olmo_metric_type)
        self.format_source = with_metric_type(self.format_source, self.olmo_metric_type)

    def doc_to_uncond(self, raw: Mapping[str, Any], index: int) -> str | Sequence[str]:
        """OLMo's domain conditional: one string, or one per context (WinoGrande)."""
        return self.uncond_context

    def make_doc(self, raw: Mapping[str, Any], index: int) -> Doc:
        doc = super().make_doc(raw, index)
        uncond = self.doc_to_uncond(raw, index)
        texts = (uncond,) * doc.n_choices if isinstance(uncond, str) else tuple(uncond)
        if len(texts) != doc.n_choices:
            raise self.error(
                index,
                f"expected one unconditional context per choice ({doc.n_choices}), found {len(texts)}",
            )
        return dataclasses.replace(doc, uncond_contexts=texts)


class AnswerPrompt(OLMoTask):
    """Formats whose prompt ends in 'Answer:', which is also their domain conditional."""

    uncond_context = "Answer:"


class PIQA(AnswerPrompt):
    """OLMo `piqa`: 'Question: {goal}\\nAnswer:' -> ' {sol1}' / ' {sol2}'."""

    dataset_path = "piqa"
    dataset_name = "plain_text"
    olmo_metric_type = "len_norm"
    format_source = "OLMo piqa: 'Question: {goal}\\nAnswer:' -> sol1/sol2"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        return "Question: " + self.text(raw, index, "goal") + "\nAnswer:"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return [self.text(raw, index, "sol1"), self.text(raw, index, "sol2")]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return self.label(raw, index, "label", 2)


class HellaSwag(OLMoTask):
    """OLMo `hellaswag`: preprocessed '{activity_label}: {ctx_a} {ctx_b.capitalize()}' -> each preprocessed
    ending; domain conditional the preprocessed `ctx_b.capitalize()`, else the last word of `ctx_a`."""

    dataset_path = "hellaswag"
    olmo_metric_type = "len_norm"
    format_source = "OLMo hellaswag: '{activity_label}: {ctx_a} {ctx_b.capitalize()}' -> endings"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        activity = self.text(raw, index, "activity_label")
        ctx_a, ctx_b = self.text(raw, index, "ctx_a"), self.text(raw, index, "ctx_b")
        return hellaswag_preprocess(activity + ": " + ctx_a + " " + ctx_b.capitalize())

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return [hellaswag_preprocess(ending) for ending in self.texts(raw, index, "endings")]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return self.label(raw, index, "label", len(self.texts(raw, index, "endings")))

    def doc_to_uncond(self, raw: Mapping[str, Any], index: int) -> str:
        conditional = hellaswag_preprocess(self.text(raw, index, "ctx_b").capitalize())
        if conditional:
            return conditional
        return hellaswag_preprocess(self.text(raw, index, "ctx_a")).split(" ")[-1]


class WinoGrande(OLMoTask):
    """OLMo `winogrande` (partial scoring): '{sentence up to _}{option}' for each option -> ' {rest after _,
    stripped}'; the domain conditional of each context is its option alone."""

    dataset_path = "winogrande"
    dataset_name = "winogrande_xl"
    prompt_format = "partial"
    format_source = "OLMo winogrande: '{sentence up to _}{option}' -> '{rest}', partial scoring"

    def _blank(self, raw: Mapping[str, Any], index: int) -> tuple[str, int]:
        sentence = self.text(raw, index, "sentence")
        if "_" not in sentence:
            raise self.error(index, f"field 'sentence': expected a '_' blank, found {sentence!r}")
        return sentence, sentence.index("_")

    def _options(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return [self.text(raw, index, "option1"), self.text(raw, index, "option2")]

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> list[str]:
        sentence, blank = self._blank(raw, index)
        return [sentence[:blank] + option for option in self._options(raw, index)]

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        sentence, blank = self._blank(raw, index)
        return [sentence[blank + 1 :].strip()]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return self.label(raw, index, "answer", 2, first=1)

    def doc_to_uncond(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return self._options(raw, index)


class OpenBookQA(OLMoTask):
    """OLMo `openbook_qa`: '{question_stem}' -> each choice; domain conditional the stem's last word."""

    dataset_path = "openbookqa"
    dataset_name = "main"
    olmo_metric_type = "len_norm"
    format_source = "OLMo openbook_qa: '{question_stem}' -> choices"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        return self.text(raw, index, "question_stem")

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return self.texts(self.field(raw, index, "choices"), index, "text")

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return _letter_index(self, raw, index, ("A", "B", "C", "D"), strip=True)

    def doc_to_uncond(self, raw: Mapping[str, Any], index: int) -> str:
        return self.text(raw, index, "question_stem").strip().split(" ")[-1]


class BoolQ(AnswerPrompt):
    """OLMo `boolq`: '{passage}\\nQuestion: {question}?\\nAnswer:' -> ' yes' / ' no' (gold ' yes' when true)."""

    dataset_path = "boolq"
    format_source = "OLMo boolq: '{passage}\\nQuestion: {question}?\\nAnswer:' -> yes/no"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        passage = self.text(raw, index, "passage")
        return passage + "\nQuestion: " + self.text(raw, index, "question") + "?\nAnswer:"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return ["yes", "no"]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return 0 if self.field(raw, index, "answer") else 1


class SciQ(AnswerPrompt):
    """OLMo `sciq`: '{support.strip()}\\nQuestion: {question}\\nAnswer:' -> the three distractors, then the
    correct answer (gold 3)."""

    dataset_path = "sciq"
    format_source = "OLMo sciq: '{support}\\nQuestion: {question}\\nAnswer:' -> distractors, correct_answer"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        support = self.text(raw, index, "support").strip()
        return support + "\nQuestion: " + self.text(raw, index, "question") + "\nAnswer:"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        names = ("distractor1", "distractor2", "distractor3", "correct_answer")
        return [self.text(raw, index, name) for name in names]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return 3


class ARCEasy(AnswerPrompt):
    """OLMo `arc_easy` (and ARC-Challenge, basic_arithmetic, CommonsenseQA): 'Question: {question}\\nAnswer:'
    -> each choice; gold `answerKey` as a letter A-E (numerals 1-5 read as letters)."""

    dataset_path = "ai2_arc"
    dataset_name = "ARC-Easy"
    format_source = "OLMo arc_easy: 'Question: {question}\\nAnswer:' -> choices"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        return "Question: " + self.text(raw, index, "question") + "\nAnswer:"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return self.texts(self.field(raw, index, "choices"), index, "text")

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return _letter_index(self, raw, index, ("A", "B", "C", "D", "E"), numerals=True)


class ARCEasyAnswer(ARCEasy):
    """OLMo `arc_easy_ppl`: the `arc_easy` prompt -> the first choice alone (ce_loss).

    OLMo means the gold choice but picks it with its overridden label, which is always 0, so it scores the
    first choice whatever the answer; this keeps OLMo's numbers.
    """

    olmo_metric_type = "ce_loss"
    format_source = "OLMo arc_easy_ppl: 'Question: {question}\\nAnswer:' -> the first choice"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return super().doc_to_continuations(raw, index)[:1]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return 0


class ARCChallenge(ARCEasy):
    """OLMo `arc_challenge`: the `arc_easy` format on ARC-Challenge."""

    dataset_name = "ARC-Challenge"
    olmo_metric_type = "len_norm"
    format_source = "OLMo arc_challenge: 'Question: {question}\\nAnswer:' -> choices"


class BasicArithmetic(ARCEasy):
    """OLMo `basic_arithmetic`: the `arc_easy` format on allenai/basic_arithmetic ('Calculate 2 + 5 =')."""

    dataset_path = "allenai/basic_arithmetic"
    dataset_name = None
    format_source = "OLMo basic_arithmetic: 'Question: {question}\\nAnswer:' -> choices"


class CommonsenseQA(ARCEasy):
    """OLMo `commonsense_qa`: the `arc_easy` format on tau/commonsense_qa."""

    dataset_path = "tau/commonsense_qa"
    dataset_name = None
    olmo_metric_type = "len_norm"
    format_source = "OLMo commonsense_qa: 'Question: {question}\\nAnswer:' -> choices"


class SocialIQa(AnswerPrompt):
    """OLMo `social_iqa`: 'Question: {context} {question}\\nAnswer:' -> answerA..C; gold `label` from 1."""

    dataset_path = "social_i_qa"
    olmo_metric_type = "len_norm"
    format_source = "OLMo social_iqa: 'Question: {context} {question}\\nAnswer:' -> answerA..C"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        context, question = self.text(raw, index, "context"), self.text(raw, index, "question")
        return "Question: " + context + " " + question + "\nAnswer:"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return [self.text(raw, index, name) for name in ("answerA", "answerB", "answerC")]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return self.label(raw, index, "label", 3, first=1)


class COPA(OLMoTask):
    """OLMo `copa`: '{premise.strip() without its last character} because|therefore' -> each choice with its
    first letter lower-cased; domain conditional the connector."""

    dataset_path = "super_glue"
    dataset_name = "copa"
    format_source = "OLMo copa: '{premise[:-1]} because|therefore' -> choice1/choice2"

    def _connector(self, raw: Mapping[str, Any], index: int) -> str:
        # OLMo reads anything other than 'cause' as an effect.
        return "because" if self.field(raw, index, "question") == "cause" else "therefore"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        return self.text(raw, index, "premise").strip()[:-1] + " " + self._connector(raw, index)

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        choices = [self.text(raw, index, "choice1"), self.text(raw, index, "choice2")]
        return [choice[:1].lower() + choice[1:] for choice in choices]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return self.label(raw, index, "label", 2)

    def doc_to_uncond(self, raw: Mapping[str, Any], index: int) -> str:
        return self._connector(raw, index)


_SPACE_BEFORE_PUNCTUATION = re.compile(r" (['.,])")


def detokenize(text: str) -> str:
    """OLMo's clean-up of GLUE's tokenized sentences (MRPC, SST-2): "does n't ( so ) ." -> "doesn't (so)."."""
    for old, new in ((" n't", "n't"), (" )", ")"), ("( ", "("), ('" ', '"'), (' "', '"')):
        text = text.replace(old, new)
    return _SPACE_BEFORE_PUNCTUATION.sub(r"\1", text)


class Classification(AnswerPrompt):
    """OLMo's GLUE/SuperGLUE formats: `template` filled with the row's fields -> the fixed `choices`."""

    prompt_format = "classification"
    template: str = ""
    fields: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()

    def field_text(self, raw: Mapping[str, Any], index: int, name: str) -> str:
        return self.text(raw, index, name)

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        return self.template.format(**{name: self.field_text(raw, index, name) for name in self.fields})

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return list(self.choices)

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return self.label(raw, index, "label", len(self.choices))


class RTE(Classification):
    """OLMo `rte`: '{sentence1}\\nQuestion: {sentence2} True or False?\\nAnswer:' -> ' True' / ' False'."""

    dataset_path = "glue"
    dataset_name = "rte"
    olmo_metric_type = "len_norm"
    template = "{sentence1}\nQuestion: {sentence2} True or False?\nAnswer:"
    fields = ("sentence1", "sentence2")
    choices = ("True", "False")
    format_source = "OLMo rte: '{sentence1}\\nQuestion: {sentence2} True or False?\\nAnswer:'"


class CommitmentBank(Classification):
    """OLMo `commitment_bank`: '{premise}\\nQuestion: {hypothesis}. True, False or Neither?\\nAnswer:'."""

    dataset_path = "super_glue"
    dataset_name = "cb"
    template = "{premise}\nQuestion: {hypothesis}. True, False or Neither?\nAnswer:"
    fields = ("premise", "hypothesis")
    choices = ("True", "False", "Neither")
    format_source = "OLMo commitment_bank: '{premise}\\nQuestion: {hypothesis}. True, False or Neither?'"


class MRPC(Classification):
    """OLMo `mrpc`: 'Sentence 1: ..\\nSentence 2: ..\\nQuestion: Do both sentences mean the same thing?\\nAnswer:'
    with detokenized sentences -> ' yes' / ' no' (gold ' yes' when equivalent)."""

    dataset_path = "glue"
    dataset_name = "mrpc"
    olmo_metric_type = "f1"
    template = (
        "Sentence 1: {sentence1}\nSentence 2: {sentence2}\n"
        "Question: Do both sentences mean the same thing?\nAnswer:"
    )
    fields = ("sentence1", "sentence2")
    choices = ("yes", "no")
    format_source = (
        "OLMo mrpc: 'Sentence 1: ..\\nSentence 2: ..\\nQuestion: Do both sentences mean the same thing?'"
    )

    def field_text(self, raw: Mapping[str, Any], index: int, name: str) -> str:
        return detokenize(self.text(raw, index, name))

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return 0 if self.field(raw, index, "label") else 1


class SST2(Classification):
    """OLMo `sst2`: '{detokenized sentence}\\nQuestion: Is this sentence positive or negative?\\nAnswer:'
    -> ' negative' / ' positive'."""

    dataset_path = "glue"
    dataset_name = "sst2"
    template = "{sentence}\nQuestion: Is this sentence positive or negative?\nAnswer:"
    fields = ("sentence",)
    choices = ("negative", "positive")
    format_source = "OLMo sst2: '{sentence}\\nQuestion: Is this sentence positive or negative?\\nAnswer:'"

    def field_text(self, raw: Mapping[str, Any], index: int, name: str) -> str:
        return detokenize(self.text(raw, index, name))


class TriviaQAAnswer(AnswerPrompt):
    """OLMo `trivia_qa_wiki_ppl`: '\\nQuestion: {question}\\nAnswer:' -> ' {answer.value}' (ce_loss)."""

    dataset_path = "trivia_qa"
    dataset_name = "rc.wikipedia.nocontext"
    olmo_metric_type = "ce_loss"
    format_source = "OLMo trivia_qa_wiki_ppl: '\\nQuestion: {question}\\nAnswer:' -> answer.value"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        return "\nQuestion: " + self.text(raw, index, "question") + "\nAnswer:"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return [self.text(self.field(raw, index, "answer"), index, "value")]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return 0


class NaturalQuestionsAnswer(TriviaQAAnswer):
    """OLMo `natural_qs_open_ppl`: '\\nQuestion: {question}\\nAnswer:' -> ' {answer[0]}' (ce_loss)."""

    dataset_path = "nq_open"
    dataset_name = None
    format_source = "OLMo natural_qs_open_ppl: '\\nQuestion: {question}\\nAnswer:' -> answer[0]"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        answers = self.texts(raw, index, "answer")
        if not answers:
            raise self.error(index, "field 'answer': expected at least one answer, found none")
        return [answers[0]]


_NUMERAL_LETTERS = {"1": "A", "2": "B", "3": "C", "4": "D", "5": "E"}


def _letter_index(
    task: MultipleChoiceTask,
    raw: Mapping[str, Any],
    index: int,
    letters: tuple[str, ...],
    *,
    strip: bool = False,
    numerals: bool = False,
) -> int:
    """The position of `answerKey` among `letters` (OLMo's gold for ARC and OpenBookQA): stripped first with
    `strip`; with `numerals`, '1'..'5' stand for 'A'..'E'."""
    key = task.text(raw, index, "answerKey")
    if strip:
        key = key.strip()
    if numerals:
        key = _NUMERAL_LETTERS.get(key, key)
    if key not in letters:
        raise task.error(index, f"field 'answerKey': expected one of {list(letters)}, found {key!r}")
    return letters.index(key)


# OLMo's hand-written formats, by their label (`LABEL_TO_TASK_MAP_ORIG`).
OWN_FORMATS: dict[str, type[OLMoTask]] = {
    "piqa": PIQA,
    "hellaswag": HellaSwag,
    "winogrande": WinoGrande,
    "openbook_qa": OpenBookQA,
    "boolq": BoolQ,
    "sciq": SciQ,
    "arc_easy": ARCEasy,
    "arc_easy_ppl": ARCEasyAnswer,
    "arc_challenge": ARCChallenge,
    "basic_arithmetic": BasicArithmetic,
    "copa": COPA,
    "rte": RTE,
    "commitment_bank": CommitmentBank,
    "mrpc": MRPC,
    "sst2": SST2,
    "commonsense_qa": CommonsenseQA,
    "social_iqa": SocialIQa,
    "trivia_qa_wiki_ppl": TriviaQAAnswer,
    "natural_qs_open_ppl": NaturalQuestionsAnswer,
}
