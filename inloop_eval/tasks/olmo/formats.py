"""OLMo's hand-written in-loop formats (ai2-olmo-eval 0.9.0 `LABEL_TO_TASK_MAP_ORIG`: piqa, hellaswag, ...,
the CE-loss answer tasks), each the native task with the `OLMoFormat` mixin (see `tasks.olmo.base`).

A class here carries only what OLMo does differently from the native task it mixes into: its metric type,
its domain conditional and, where OLMo's rendering differs, the one method that renders the difference
(OpenBookQA's bare question stem, BoolQ's and MRPC's choice order, COPA's premise cut, CB's template, the
GLUE detokenisation, the answer tasks' leading newline, the ARC family's letter gold).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from inloop_eval.tasks.native.arc import ARCChallenge, ARCEasy
from inloop_eval.tasks.native.boolq import BoolQ
from inloop_eval.tasks.native.classification import MRPC, RTE, SST2, CommitmentBank
from inloop_eval.tasks.native.commonsense_qa import CommonsenseQA
from inloop_eval.tasks.native.copa import COPA
from inloop_eval.tasks.native.gold_only import NaturalQuestionsAnswers, TriviaQAAnswers
from inloop_eval.tasks.native.hellaswag import HellaSwag
from inloop_eval.tasks.native.hellaswag import preprocess as hellaswag_preprocess
from inloop_eval.tasks.native.openbookqa import OpenBookQA
from inloop_eval.tasks.native.piqa import PIQA
from inloop_eval.tasks.native.sciq import SciQ
from inloop_eval.tasks.native.social_iqa import SocialIQA
from inloop_eval.tasks.native.winogrande import WinoGrande
from inloop_eval.tasks.olmo.base import OLMoFormat

# The domain conditional of the formats whose prompt ends in 'Answer:'.
ANSWER_CONDITIONAL = "Answer:"


class OLMoPIQA(OLMoFormat, PIQA):
    """OLMo `piqa`: the native prompt and solutions, scored by len_norm."""

    uncond_context = ANSWER_CONDITIONAL
    olmo_metric_type = "len_norm"
    format_source = "OLMo piqa: 'Question: {goal}\\nAnswer:' -> sol1/sol2"


class OLMoHellaSwag(OLMoFormat, HellaSwag):
    """OLMo `hellaswag`: the native prompt and endings, scored by len_norm; domain conditional the
    preprocessed `ctx_b.capitalize()`, else the last word of `ctx_a`."""

    olmo_metric_type = "len_norm"
    format_source = "OLMo hellaswag: '{activity_label}: {ctx_a} {ctx_b.capitalize()}' -> endings"

    def doc_to_uncond(self, raw: Mapping[str, Any], index: int) -> str:
        conditional = hellaswag_preprocess(self.text(raw, index, "ctx_b").capitalize())
        if conditional:
            return conditional
        return hellaswag_preprocess(self.text(raw, index, "ctx_a")).split(" ")[-1]


class OLMoWinoGrande(OLMoFormat, WinoGrande):
    """OLMo `winogrande`: the native partial scoring, filling a sentence's first '_' where it has several;
    the domain conditional of each context is its option alone."""

    format_source = "OLMo winogrande: '{sentence up to _}{option}' -> '{rest}', partial scoring"

    def blank(self, raw: Mapping[str, Any], index: int) -> tuple[str, int]:
        sentence = self.text(raw, index, "sentence")
        if "_" not in sentence:
            raise self.error(index, f"field 'sentence': expected a '_' blank, found {sentence!r}")
        return sentence, sentence.index("_")

    def doc_to_uncond(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return self.options(raw, index)


class OLMoBoolQ(OLMoFormat, BoolQ):
    """OLMo `boolq`: the native prompt -> ' yes' / ' no' in that order (gold ' yes' when `answer` is true)."""

    uncond_context = ANSWER_CONDITIONAL
    format_source = "OLMo boolq: '{passage}\\nQuestion: {question}?\\nAnswer:' -> yes/no"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return ["yes", "no"]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return 0 if self.field(raw, index, "answer") else 1


class OLMoSciQ(OLMoFormat, SciQ):
    """OLMo `sciq`: the native prompt, the three distractors then the correct answer (gold 3)."""

    uncond_context = ANSWER_CONDITIONAL
    format_source = "OLMo sciq: '{support}\\nQuestion: {question}\\nAnswer:' -> distractors, correct_answer"


class OLMoSocialIQA(OLMoFormat, SocialIQA):
    """OLMo `social_iqa`: the native prompt and answers, scored by len_norm."""

    uncond_context = ANSWER_CONDITIONAL
    olmo_metric_type = "len_norm"
    format_source = "OLMo social_iqa: 'Question: {context} {question}\\nAnswer:' -> answerA..C"


_NUMERAL_LETTERS = {"1": "A", "2": "B", "3": "C", "4": "D", "5": "E"}


class OLMoAnswerKey(OLMoFormat):
    """Mixin over a native `LabelledChoicesTask` (ARC, OpenBookQA, CommonsenseQA) for OLMo's reading of the
    choices: their texts as they are, `choices.label` unread, and the gold the position of `answerKey`
    among `answer_letters` (stripped first with `strip_key`; with `numeral_keys`, '1'..'5' stand for 'A'..'E')."""

    answer_letters: tuple[str, ...] = ("A", "B", "C", "D", "E")
    strip_key: bool = False
    numeral_keys: bool = True

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return self.texts(self.field(raw, index, "choices"), index, "text")

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        key = self.text(raw, index, "answerKey")
        if self.strip_key:
            key = key.strip()
        if self.numeral_keys:
            key = _NUMERAL_LETTERS.get(key, key)
        if key not in self.answer_letters:
            raise self.error(
                index, f"field 'answerKey': expected one of {list(self.answer_letters)}, found {key!r}"
            )
        return self.answer_letters.index(key)


class OLMoARCEasy(OLMoAnswerKey, ARCEasy):
    """OLMo `arc_easy`: the native prompt -> each choice."""

    uncond_context = ANSWER_CONDITIONAL
    format_source = "OLMo arc_easy: 'Question: {question}\\nAnswer:' -> choices"


class OLMoARCEasyFirstChoice(OLMoARCEasy):
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


class OLMoARCChallenge(OLMoAnswerKey, ARCChallenge):
    """OLMo `arc_challenge`: the `arc_easy` format on ARC-Challenge, scored by len_norm."""

    uncond_context = ANSWER_CONDITIONAL
    olmo_metric_type = "len_norm"
    format_source = "OLMo arc_challenge: 'Question: {question}\\nAnswer:' -> choices"


class OLMoBasicArithmetic(OLMoARCEasy):
    """OLMo `basic_arithmetic`: the `arc_easy` format on allenai/basic_arithmetic ('Calculate 2 + 5 =')."""

    dataset_path = "allenai/basic_arithmetic"
    dataset_name = None
    format_source = "OLMo basic_arithmetic: 'Question: {question}\\nAnswer:' -> choices"


class OLMoCommonsenseQA(OLMoAnswerKey, CommonsenseQA):
    """OLMo `commonsense_qa`: the `arc_easy` format on tau/commonsense_qa, scored by len_norm."""

    uncond_context = ANSWER_CONDITIONAL
    olmo_metric_type = "len_norm"
    format_source = "OLMo commonsense_qa: 'Question: {question}\\nAnswer:' -> choices"


class OLMoOpenBookQA(OLMoAnswerKey, OpenBookQA):
    """OLMo `openbook_qa`: the bare '{question_stem}' -> each choice, gold `answerKey` among A-D; domain
    conditional the stem's last word."""

    answer_letters = ("A", "B", "C", "D")
    strip_key = True
    numeral_keys = False
    olmo_metric_type = "len_norm"
    format_source = "OLMo openbook_qa: '{question_stem}' -> choices"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        return self.text(raw, index, self.question_field)

    def doc_to_uncond(self, raw: Mapping[str, Any], index: int) -> str:
        return self.text(raw, index, self.question_field).strip().split(" ")[-1]


class OLMoCOPA(OLMoFormat, COPA):
    """OLMo `copa`: '{premise.strip() without its last character} because|therefore' -> each choice with its
    first letter lower-cased; domain conditional the connector."""

    format_source = "OLMo copa: '{premise[:-1]} because|therefore' -> choice1/choice2"

    def premise(self, raw: Mapping[str, Any], index: int) -> str:
        return self.text(raw, index, "premise").strip()[:-1]

    def connector(self, raw: Mapping[str, Any], index: int) -> str:
        # OLMo reads anything other than 'cause' as an effect.
        return "because" if self.field(raw, index, "question") == "cause" else "therefore"

    def doc_to_uncond(self, raw: Mapping[str, Any], index: int) -> str:
        return self.connector(raw, index)


_SPACE_BEFORE_PUNCTUATION = re.compile(r" (['.,])")


def detokenize(text: str) -> str:
    """OLMo's clean-up of GLUE's tokenized sentences (MRPC, SST-2): "does n't ( so ) ." -> "doesn't (so)."."""
    for old, new in ((" n't", "n't"), (" )", ")"), ("( ", "("), ('" ', '"'), (' "', '"')):
        text = text.replace(old, new)
    return _SPACE_BEFORE_PUNCTUATION.sub(r"\1", text)


class OLMoRTE(OLMoFormat, RTE):
    """OLMo `rte`: the native prompt -> ' True' / ' False', scored by len_norm."""

    uncond_context = ANSWER_CONDITIONAL
    olmo_metric_type = "len_norm"
    format_source = "OLMo rte: '{sentence1}\\nQuestion: {sentence2} True or False?\\nAnswer:'"


class OLMoCommitmentBank(OLMoFormat, CommitmentBank):
    """OLMo `commitment_bank`: '{premise}\\nQuestion: {hypothesis}. True, False or Neither?\\nAnswer:' (no
    comma before 'or')."""

    uncond_context = ANSWER_CONDITIONAL
    template = "{premise}\nQuestion: {hypothesis}. True, False or Neither?\nAnswer:"
    format_source = "OLMo commitment_bank: '{premise}\\nQuestion: {hypothesis}. True, False or Neither?'"


class OLMoMRPC(OLMoFormat, MRPC):
    """OLMo `mrpc`: the native prompt over detokenized sentences -> ' yes' / ' no' in that order (gold ' yes'
    when equivalent), scored by f1."""

    uncond_context = ANSWER_CONDITIONAL
    olmo_metric_type = "f1"
    choices = ("yes", "no")
    format_source = (
        "OLMo mrpc: 'Sentence 1: ..\\nSentence 2: ..\\nQuestion: Do both sentences mean the same thing?'"
    )

    def field_text(self, raw: Mapping[str, Any], index: int, name: str) -> str:
        return detokenize(super().field_text(raw, index, name))

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return 0 if self.field(raw, index, "label") else 1


class OLMoSST2(OLMoFormat, SST2):
    """OLMo `sst2`: the native prompt over the detokenized sentence -> ' negative' / ' positive'."""

    uncond_context = ANSWER_CONDITIONAL
    format_source = "OLMo sst2: '{sentence}\\nQuestion: Is this sentence positive or negative?\\nAnswer:'"

    def field_text(self, raw: Mapping[str, Any], index: int, name: str) -> str:
        return detokenize(super().field_text(raw, index, name))


class OLMoAnswerOnly(OLMoFormat):
    """Mixin over a native gold-only task for OLMo's `*_ppl` labels: the prompt '\\nQuestion:
    {question}\\nAnswer:' (a leading newline, the question as it is) -> the native answer, scored by ce_loss."""

    uncond_context = ANSWER_CONDITIONAL
    olmo_metric_type = "ce_loss"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        return "\nQuestion: " + self.text(raw, index, "question") + "\nAnswer:"


class OLMoTriviaQAAnswer(OLMoAnswerOnly, TriviaQAAnswers):
    """OLMo `trivia_qa_wiki_ppl`: '\\nQuestion: {question}\\nAnswer:' -> ' {answer.value}'."""

    format_source = "OLMo trivia_qa_wiki_ppl: '\\nQuestion: {question}\\nAnswer:' -> answer.value"


class OLMoNaturalQuestionsAnswer(OLMoAnswerOnly, NaturalQuestionsAnswers):
    """OLMo `natural_qs_open_ppl`: '\\nQuestion: {question}\\nAnswer:' -> ' {answer[0]}'."""

    format_source = "OLMo natural_qs_open_ppl: '\\nQuestion: {question}\\nAnswer:' -> answer[0]"


# OLMo's hand-written formats, by their label (`LABEL_TO_TASK_MAP_ORIG`).
OWN_FORMATS: dict[str, type[OLMoFormat]] = {
    "piqa": OLMoPIQA,
    "hellaswag": OLMoHellaSwag,
    "winogrande": OLMoWinoGrande,
    "openbook_qa": OLMoOpenBookQA,
    "boolq": OLMoBoolQ,
    "sciq": OLMoSciQ,
    "arc_easy": OLMoARCEasy,
    "arc_easy_ppl": OLMoARCEasyFirstChoice,
    "arc_challenge": OLMoARCChallenge,
    "basic_arithmetic": OLMoBasicArithmetic,
    "copa": OLMoCOPA,
    "rte": OLMoRTE,
    "commitment_bank": OLMoCommitmentBank,
    "mrpc": OLMoMRPC,
    "sst2": OLMoSST2,
    "commonsense_qa": OLMoCommonsenseQA,
    "social_iqa": OLMoSocialIQA,
    "trivia_qa_wiki_ppl": OLMoTriviaQAAnswer,
    "natural_qs_open_ppl": OLMoNaturalQuestionsAnswer,
}
