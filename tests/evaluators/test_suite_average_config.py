"""Suite averages in the evaluator: their config checks, their keys, and their per-document outcomes."""

from __future__ import annotations

import numpy as np
import pinned_scores as pin
import pytest

from inloop_eval.errors import ConfigError
from inloop_eval.evaluators.config import EvaluatorConfig, SuiteAverageConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.keys import SUITE, figure_key, suite_outcomes_label

TASKS = [{"task": "piqa", "limit": 12}, {"task": "hellaswag", "limit": 10}, {"task": "arc_easy", "limit": 8}]


@pytest.mark.parametrize(
    ("suite", "message"),
    [
        ({"label": "core", "tasks": ["piqa", "boolq"]}, r"unknown task labels \['boolq'\]"),
        ({"label": "core", "tasks": []}, "names no task"),
        ({"label": "core", "tasks": ["piqa", "piqa"]}, "tasks named twice"),
        ({"label": "Core", "tasks": ["piqa"]}, "lower-case"),
        ({"label": "core", "tasks": ["piqa"], "figure": "ce_gold"}, "not an accuracy-type figure"),
        ({"label": "core", "tasks": ["piqa"], "figure": "nonsense"}, "not an accuracy-type figure"),
        ({"label": "core", "tasks": "piqa", "other": 1}, "unknown keys"),
    ],
)
def test_suite_config_checks(suite, message):
    with pytest.raises(ConfigError, match=message):
        EvaluatorConfig.from_dict({"evaluators": TASKS, "suite_average": [suite]})


def test_suite_labels_are_unique():
    suite = {"label": "core", "tasks": ["piqa"]}
    with pytest.raises(ConfigError, match=r"repeated: \['core'\]"):
        EvaluatorConfig.from_dict({"evaluators": TASKS, "suite_average": [suite, suite]})


def test_one_suite_may_be_given_as_a_mapping_alone():
    config = EvaluatorConfig.from_dict(
        {"evaluators": TASKS, "suite_average": {"label": "core", "tasks": ["piqa"]}}
    )
    assert config.suite_average == [SuiteAverageConfig(label="core", tasks=["piqa"])]


def test_suite_average_is_logged_and_its_outcomes_kept(data_root, neox_tokenizer):
    config = EvaluatorConfig.from_dict(
        {
            "evaluators": TASKS,
            "data_root": str(data_root),
            "strict": True,
            "suite_average": [{"label": "core", "tasks": ["piqa", "hellaswag", "arc_easy"]}],
        }
    )
    evaluator = InLoopEvaluator(config, tokenizer=neox_tokenizer)
    metrics = evaluator.run(pin.pinned_model())
    outcomes = evaluator.outcomes()
    centred = []
    for label in ("piqa", "hellaswag", "arc_easy"):
        o = outcomes[label]
        chance = 1.0 / o.n_choices
        centred.append(((o.values["acc"] - chance) / (1 - chance)).mean())
        # The tasks' own acc is the mean of the outcomes the suite reads.
        assert metrics[f"eval/downstream/{label}/acc"] == pytest.approx(o.values["acc"].mean())
    assert metrics[figure_key(SUITE, "core", "centered_acc")] == pytest.approx(np.mean(centred), abs=1e-12)
    assert metrics[figure_key(SUITE, "core", "centered_acc_stderr")] > 0
    pooled = outcomes[suite_outcomes_label("core")]
    assert len(pooled.doc_id) == 12 + 10 + 8
    assert pooled.values["centered_acc"].mean() == pytest.approx(np.mean(centred), abs=1e-12)


def test_a_suite_of_a_failed_task_reports_failed(data_root, neox_tokenizer, monkeypatch, caplog):
    config = EvaluatorConfig.from_dict(
        {
            "evaluators": TASKS[:2],
            "data_root": str(data_root),
            "suite_average": [{"label": "core", "tasks": ["piqa", "hellaswag"]}],
        }
    )
    evaluator = InLoopEvaluator(config, tokenizer=neox_tokenizer)
    monkeypatch.setattr(evaluator.evaluators["hellaswag"], "prepare", broken)
    metrics = evaluator.run(pin.pinned_model())
    assert metrics[figure_key(SUITE, "core", "failed")] == 1.0
    assert figure_key(SUITE, "core", "centered_acc") not in metrics
    assert suite_outcomes_label("core") not in evaluator.outcomes()
    assert "suite_average 'core' not computed: suite task 'hellaswag'" in caplog.text


def broken(*args, **kwargs):
    raise OSError("disk gone")
