"""The table of evaluator kinds, the steps every kind shares (`Evaluator.run`), and the keys the orchestrator
gives the bare figures evaluators return."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from inloop_eval.engine.adapter import ModelAdapter, TokenCount
from inloop_eval.engine.batching import BatchShape
from inloop_eval.engine.evaluation import EvalContext
from inloop_eval.errors import TaskDataError
from inloop_eval.evaluators.base import EvalOutput, Evaluator, entry_type
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.downstream import DownstreamEvaluator, TaskEvalConfig
from inloop_eval.evaluators.kinds import KINDS
from inloop_eval.evaluators.perplexity import LMEvalConfig, PerplexityEvaluator
from inloop_eval.keys import DOWNSTREAM, FAILED, PERPLEXITY, key_style, metric_keys


def test_each_type_selects_its_evaluator_and_its_config():
    assert KINDS == {"downstream": DownstreamEvaluator, "lm": PerplexityEvaluator}
    for type_name, kind in KINDS.items():
        assert entry_type(kind.config_class) == type_name
    assert (DownstreamEvaluator.kind, PerplexityEvaluator.kind) == (DOWNSTREAM, PERPLEXITY)


def test_config_entries_are_built_by_their_type():
    lm = {"type": "lm", "domains": [{"label": "code", "paths": ["a.npy"]}]}
    config = EvaluatorConfig.from_dict({"evaluators": [{"task": "piqa"}, lm]})
    assert [type(e) for e in config.evaluators] == [TaskEvalConfig, LMEvalConfig]
    assert [e.labels() for e in config.evaluators] == [["piqa"], ["code"]]


@pytest.mark.parametrize(
    ("style", "prefix", "expected"),
    [
        ("inloop", "eval", {"eval/downstream/arc/acc": 0.5, "eval/downstream/arc/acc_v1": 0.25}),
        ("olmo_core", "eval", {"eval/downstream/arc/acc": 0.5, "eval/downstream/arc_easy (accuracy)": 0.25}),
        (
            "olmo_core",
            "eval/merged",
            {"eval/merged/downstream/arc/acc": 0.5, "eval/merged/downstream/arc_easy (accuracy)": 0.25},
        ),
    ],
)
def test_figures_are_named_by_kind_label_and_key_style(style, prefix, expected):
    output = EvalOutput({"arc": {"acc": 0.5, "acc_v1": 0.25}}, sources={"arc": "olmo:arc_easy"})
    found = metric_keys(DOWNSTREAM, output.figures, output.sources, key_style(style), prefix)
    assert found == expected and list(found) == list(expected)


def test_perplexity_figures_and_failures_keep_our_keys():
    output = EvalOutput({"c4": {"ce": 2.0, "ppl": 7.0}, "code": {FAILED: 1.0}})
    assert metric_keys(PERPLEXITY, output.figures, output.sources, key_style("olmo_core")) == {
        "eval/lm/c4/ce": 2.0,
        "eval/lm/c4/ppl": 7.0,
        "eval/lm/code/failed": 1.0,
    }


@dataclass(kw_only=True)
class TwoLabels:
    type: str = "two"
    labels_name = "test labels"

    def labels(self) -> list[str]:
        return ["a", "b"]


class FailingEvaluator(Evaluator[TwoLabels, None]):
    """A kind whose preparation fails, recording the `strict` each step is given."""

    kind = "test"
    config_class = TwoLabels

    def __init__(self) -> None:
        super().__init__(TwoLabels(), tokenizer=None, settings=None)
        self.name = "two"
        self.strict_seen: list[bool] = []

    def prepare(self, context, agreement):
        self.strict_seen.append(context.strict)
        raise TaskDataError("no data")


def test_a_failed_evaluation_reports_every_label_failed_or_raises_when_strict():
    evaluator = FailingEvaluator()

    def context(strict: bool) -> EvalContext:
        return EvalContext(ModelAdapter(None), None, None, BatchShape(), TokenCount(), strict)

    assert evaluator.run(context(False)).figures == {"a": {FAILED: 1.0}, "b": {FAILED: 1.0}}
    with pytest.raises(TaskDataError, match="no data"):
        evaluator.run(context(True))
    assert evaluator.strict_seen == [False, True]
    assert evaluator.samples(EvalOutput({})) == []
