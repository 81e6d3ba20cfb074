"""`inloop-eval lint` flags each problem on constructed tasks and passes a clean one; `tasks --describe` shows a
rendered request."""

from __future__ import annotations

import pytest

from inloop_eval.cli import main
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.metrics.formats import MC_METRICS, RC_METRICS
from inloop_eval.models.gpt import GPT, GPTConfig
from inloop_eval.tasks import Doc, get_task, registry
from inloop_eval.tasks.base import MultipleChoiceTask
from inloop_eval.tasks.lint import ERROR, WARNING, lint_docs, lint_task

CTX = "Question: Which is a metal?\nAnswer:"


class ListTask(MultipleChoiceTask):
    """A task over given documents: its rows are the documents themselves."""

    def __init__(self, name: str, docs: list[Doc], **attrs) -> None:  # noqa: ANN003
        self.name = name
        self.docs = docs
        for key, value in attrs.items():
            setattr(self, key, value)

    def rows(self, subset, split, data_root):  # noqa: ANN001
        return self.docs

    def make_doc(self, raw, index):  # noqa: ANN001
        return raw


def doc(index: int, choices: tuple[str, ...], gold: tuple[int, ...] = (0,), context: str = CTX) -> Doc:
    return Doc(index, (context,) * len(choices), choices, gold)


CLEAN = [doc(0, ("iron", "wood", "glass")), doc(1, ("copper", "paper", "cotton"), (0,))]


def issues(task: MultipleChoiceTask) -> dict[str, set[str]]:
    """code -> severities found."""
    out: dict[str, set[str]] = {}
    for issue in lint_docs(task, task.docs).issues:
        out.setdefault(issue.code, set()).add(issue.severity)
    return out


def test_clean_task_passes():
    report = lint_task(ListTask("clean", CLEAN))
    assert report.issues == [] and report.n_docs == 2
    assert "clean: 2 docs, 0 errors, 0 warnings" in report.summary()


@pytest.mark.parametrize(
    ("docs", "attrs", "code", "severity"),
    [
        ([doc(0, ("iron", "wood"), (2,))], {}, "gold-out-of-range", ERROR),
        ([doc(0, ("iron", "wood"), ())], {}, "gold-out-of-range", ERROR),
        ([doc(0, ("iron", " ", "wood"))], {}, "empty-choice", ERROR),
        ([doc(0, ("iron", "wood", "iron"), (2,))], {}, "duplicate-choice", ERROR),
        ([doc(0, ("iron", "wood", "wood"))], {}, "duplicate-choice", WARNING),
        (
            [doc(0, ("A", "B", "C"))],
            {"prompt_format": "mc", "metrics": RC_METRICS},
            "length-norm-on-letter-keys",
            ERROR,
        ),
        (
            [doc(0, ("A", "B")), doc(1, ("A", "B"))],
            {"metrics": ("acc", "acc_norm")},
            "length-norm-on-letter-keys",
            ERROR,
        ),
        ([doc(0, ("iron ", "wood"))], {}, "choice-trailing-whitespace", WARNING),
        ([doc(0, ("iron", "wood\n"))], {}, "choice-trailing-whitespace", WARNING),
        ([doc(0, (" iron", "wood"))], {}, "choice-leading-whitespace", WARNING),
        ([doc(0, (" iron", " wood"))], {}, "choice-leading-whitespace", WARNING),
        (
            [doc(0, (" iron", " wood")), *CLEAN],
            {"target_delimiter": ""},
            "leading-whitespace-across-docs",
            WARNING,
        ),
        ([doc(0, ("iron", "wood"), context=CTX + " ")], {}, "context-trailing-whitespace", WARNING),
        ([doc(0, ("iron", "wood"), context=CTX + "\n")], {}, "context-trailing-whitespace", WARNING),
        ([Doc(0, (CTX, CTX), ("iron", "wood"), (0,), shots=4)], {"num_fewshot": 5}, "fewer-shots", WARNING),
        ([doc(0, ("iron",)), doc(1, ("wood",))], {}, "single-choice", ERROR),
    ],
)
def test_each_problem_is_flagged(docs, attrs, code, severity):
    found = issues(ListTask("bad", docs, **attrs))
    assert found.get(code) == {severity}, found
    task = ListTask("bad", docs, **attrs)
    report = lint_docs(task, task.docs)
    assert any(i.doc in (0, None) and i.code == code for i in report.issues)
    assert code in report.summary()


def test_one_choice_documents_are_an_error_only_where_a_figure_compares_choices():
    """acc over documents of one choice is 1 whatever the model does; a likelihood figure of the one
    continuation (a gold-only task) is fine."""
    single = [doc(0, ("iron",)), doc(1, ("wood",))]
    report = lint_docs(ListTask("one", single), single)
    assert [i.doc for i in report.issues if i.code == "single-choice"] == [0, 1]
    assert "one: 2 docs, 2 errors, 0 warnings" in report.summary()
    assert "'acc'" in report.issues[0].message
    assert issues(ListTask("gold_only", single, metrics=("ce_gold", "bpb_gold"))) == {}


def test_only_the_problem_is_flagged():
    """Each constructed problem flags its own code and nothing else (the checks do not overlap)."""
    assert issues(ListTask("t", [doc(0, ("iron ", "wood"))])) == {"choice-trailing-whitespace": {WARNING}}
    assert issues(ListTask("t", [doc(0, ("A", "B"))], prompt_format="mc", metrics=MC_METRICS)) == {}
    # Without whitespace in the delimiter, leading spaces on every choice are how the task spells them.
    assert issues(ListTask("t", [doc(0, (" iron", " wood"))], target_delimiter="")) == {}


def test_mmlu_document_with_fewer_shots_is_flagged(data_root):
    report = lint_task(get_task("mmlu_college_physics_mc_5shot"), data_root)
    assert [(i.code, i.doc) for i in report.issues] == [("fewer-shots", 5)]


def test_load_failure_is_an_error_naming_the_document(data_root):
    class BadGold(ListTask):
        def rows(self, subset, split, data_root):  # noqa: ANN001
            return [{"goal": "g", "sol1": "a", "sol2": "b", "label": 5}]

        def make_doc(self, raw, index):  # noqa: ANN001
            return get_task("piqa").make_doc(raw, 17)

    report = lint_task(BadGold("piqa_bad", []))
    assert [i.code for i in report.errors] == ["load-failed"]
    assert "doc 17" in report.errors[0].message and "'label'" in report.errors[0].message


def test_length_spread_summary():
    docs = [doc(i, ("a" * (i + 1), "bbbbbbbbbbbbbbbbbbbb", "c"), (1,)) for i in range(4)]
    report = lint_docs(ListTask("long", docs), docs)
    assert report.stats["gold_longest"] == 1.0 and report.stats["gold_shortest"] == 0.0
    assert report.stats["ratio_max"] == 20.0 and report.stats["bytes_max"] == 20.0
    assert "gold is the longest choice in 100.0% of docs" in report.summary()


def test_cli_exit_codes(monkeypatch, capsys):
    tasks = {
        "lint_clean": ListTask("lint_clean", CLEAN),
        "lint_warn": ListTask("lint_warn", [doc(0, ("iron ", "wood"))]),
        "lint_error": ListTask("lint_error", [doc(0, ("iron", "iron"), (1,))]),
    }
    for name, task in tasks.items():
        monkeypatch.setitem(registry._FACTORIES, name, lambda task=task: task)
    assert main(["lint", "lint_clean"]) == 0
    assert main(["lint", "lint_clean", "lint_warn"]) == 0
    assert main(["lint", "lint_clean", "lint_warn", "--strict"]) == 1
    assert main(["lint", "lint_error", "lint_clean"]) == 1
    out = capsys.readouterr().out
    assert "lint_error: 1 docs, 1 errors, 0 warnings" in out and "lint_clean: 2 docs, 0 errors" in out


def test_builtin_letter_key_tasks_lint_clean(data_root):
    for name in ("mmlu_anatomy_mc", "arc_easy_mc_5shot"):
        report = lint_task(get_task(name), data_root, limit=40)
        assert report.issues == [], report.summary()


def test_describe_shows_a_rendered_request(data_root, capsys):
    assert main(["tasks", "--describe", "arc_easy_mc_1shot", "--data-root", str(data_root)]) == 0
    out = capsys.readouterr().out
    assert "task: arc_easy_mc_1shot" in out and "few-shot: 1 examples, random" in out
    assert "Question: Which technology was developed most recently?\n A. cellular telephone\n" in out
    assert "* choice 0: ' A'  (gold)" in out and "  choice 3: ' D'" in out
    assert main(["tasks", "--describe", "winogrande", "--doc", "2", "--data-root", str(data_root)]) == 0
    out = capsys.readouterr().out
    assert "document 2: 2 choices" in out and "--- context of choice 1 ---" in out


def test_describe_shows_olmos_encoding_and_unconditional_contexts(data_root, capsys):
    """An olmo: task keeps its context's trailing text as OLMo encodes it, and shows each choice's own
    domain-conditional context."""
    assert main(["tasks", "--describe", "olmo:hellaswag", "--data-root", str(data_root)]) == 0
    out = capsys.readouterr().out
    assert "pair encoding: olmo" in out and "OLMo metric type: len_norm" in out
    assert "* choice 3: ' starts pulling up roofing on a roof.'  (gold)" in out
    assert "  unconditional context of choice 0: 'He'" in out


def test_evaluating_single_choice_documents_says_their_accuracy_means_nothing(neox_tokenizer, caplog, monkeypatch):
    """The evaluation itself warns too: acc over documents of one choice is 1 whatever the model does."""
    docs = [doc(0, (" iron",)), doc(1, (" wood",)), doc(2, (" glass", " paper"))]
    # Registered for this test only: the registry is global.
    monkeypatch.setitem(registry._FACTORIES, "lint_single_choice", lambda: ListTask("lint_single_choice", docs))
    config = EvaluatorConfig(evaluators=[{"task": "lint_single_choice", "metrics": ["acc", "ce_gold"]}])
    model = GPT(GPTConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=64))
    out = InLoopEvaluator(config, tokenizer=neox_tokenizer).run(model)
    assert out["eval/downstream/lint_single_choice/n_docs"] == 3
    assert "task 'lint_single_choice': 2 of 3 documents have a single choice, so ['acc'] are perfect" in caplog.text
