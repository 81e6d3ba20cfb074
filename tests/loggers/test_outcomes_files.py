"""Per-document outcome files: the format read back, a resumed run, a failing disk, the config switch."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.integrations import run_and_log
from inloop_eval.loggers import JSONLLogger, MultiLogger
from inloop_eval.loggers.outcomes import (
    VERSION,
    OutcomesError,
    list_steps,
    outcome_arrays,
    outcomes_directory,
    read_step,
    write_step,
)
from inloop_eval.metrics.icl import DocumentOutcomes
from inloop_eval.models.gpt import GPT, GPTConfig


def outcomes(seed: int, n: int = 5) -> dict[str, DocumentOutcomes]:
    rng = np.random.default_rng(seed)
    task = DocumentOutcomes(
        doc_id=np.arange(n, dtype=np.int64) * 3,
        n_choices=np.full(n, 4, dtype=np.int64),
        values={"acc": (rng.random(n) < 0.5).astype(np.float64), "ce_gold": rng.random(n)},
        binary=frozenset({"acc"}),
        left_out={"f1": "whole"},
    )
    return {"piqa": task, "olmo:arc_easy": task}


def test_a_step_file_reads_back_what_was_written(tmp_path):
    written = outcomes(0)
    path = write_step(tmp_path, written, 100)
    assert path.name == "step_100.npz"
    back = read_step(path)
    assert back.step == 100 and list(back.tasks) == ["piqa", "olmo:arc_easy"]
    for label, task in written.items():
        got = back.tasks[label]
        assert got.doc_id.tolist() == task.doc_id.tolist() and got.n_choices.tolist() == [4] * 5
        assert got.binary == {"acc"} and got.left_out == {"f1": "whole"}
        for name, values in task.values.items():
            assert got.values[name].dtype == np.float64 and np.array_equal(got.values[name], values)
    assert outcome_arrays(written, 100)["t0.acc"].dtype == np.uint8


def test_a_file_of_a_newer_version_or_another_format_is_refused_naming_it(tmp_path):
    arrays = outcome_arrays(outcomes(0), 5)
    meta = json.loads(str(arrays["meta"]))
    np.savez(tmp_path / "step_5.npz", **{**arrays, "meta": np.array(json.dumps({**meta, "version": VERSION + 1}))})
    with pytest.raises(OutcomesError, match="step_5.npz.*upgrade inloop_eval"):
        read_step(tmp_path / "step_5.npz")
    np.savez(tmp_path / "step_6.npz", meta=np.array(json.dumps({"format": "other"})))
    with pytest.raises(OutcomesError, match="not an inloop_eval.outcomes file"):
        read_step(tmp_path / "step_6.npz")
    (tmp_path / "step_7.npz").write_bytes(b"cut off")
    with pytest.raises(OutcomesError, match="step_7.npz: not a readable .npz archive"):
        read_step(tmp_path / "step_7.npz")


def test_a_resumed_run_appends_steps_and_never_holds_a_step_twice(tmp_path):
    first = JSONLLogger(tmp_path)
    for step in (100, 200):
        first.log_outcomes(outcomes(step), step)
    first.finish()
    resumed = JSONLLogger(tmp_path)  # restarted from the checkpoint of step 150: re-runs 200
    for step in (200, 300):
        resumed.log_outcomes(outcomes(step + 1), step)
    resumed.finish()
    directory = outcomes_directory(tmp_path)
    assert directory == tmp_path / "outcomes"
    assert list(list_steps(directory)) == [100, 200, 300]
    again = read_step(list_steps(directory)[200]).tasks["piqa"].values["ce_gold"]
    assert np.array_equal(again, outcomes(201)["piqa"].values["ce_gold"])
    assert not [p for p in directory.iterdir() if p.suffix == ".tmp"]


def test_outcomes_that_cannot_be_written_warn_once_and_never_stop_training(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    (run / "outcomes").write_text("a file where the folder should be")
    logger = MultiLogger([JSONLLogger(run)])
    with caplog.at_level(logging.WARNING):
        for step in range(3):
            logger.log_outcomes(outcomes(step), step)
    warnings = [r.getMessage() for r in caplog.records if "per-document outcomes" in r.getMessage()]
    assert len(warnings) == 1 and "step 0 not written" in warnings[0] and "training goes on" in warnings[0]


def test_a_directory_without_outcomes_is_an_error_saying_how_to_get_them(tmp_path):
    with pytest.raises(OutcomesError, match="evaluate --outcomes DIR"):
        outcomes_directory(tmp_path)


@pytest.mark.parametrize("keep", [True, False])
def test_run_and_log_writes_each_tasks_outcomes_unless_the_config_turns_them_off(
    data_root, neox_tokenizer, tmp_path, keep
):
    config = EvaluatorConfig(
        evaluators=[{"task": "piqa", "limit": 6, "batch_tokens": 1024}, {"task": "arc_easy", "limit": 5}],
        data_root=str(data_root),
        outcomes=keep,
    )
    evaluator = InLoopEvaluator(config, tokenizer=neox_tokenizer)
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=256))
    with JSONLLogger(tmp_path) as logger:
        metrics = run_and_log(evaluator, model, step=7, logger=logger)
    if not keep:
        assert not (tmp_path / "outcomes").exists()
        return
    step = read_step(tmp_path / "outcomes" / "step_7.npz")
    assert list(step.tasks) == ["piqa", "arc_easy"]
    for label, task in step.tasks.items():
        assert len(task.doc_id) == metrics[f"eval/downstream/{label}/n_docs"]
        for name, values in task.values.items():
            assert float(torch.as_tensor(values).mean()) == metrics[f"eval/downstream/{label}/{name}"]
