"""`inloop-eval compare` on damaged sides: a damaged file, a named pipe, a step that is not one, a figure no
task has. Each exits 2 with one line naming what is wrong (and, with `--json`, a JSON error on stdout)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from outcome_files import DAMAGED, task_outcomes

from inloop_eval.cli.main import main
from inloop_eval.compare.pairing import compare_steps
from inloop_eval.loggers.outcomes import OUTCOMES_DIR, OutcomesError, StepOutcomes, step_path, write_step


@pytest.fixture
def good(tmp_path) -> Path:
    run = tmp_path / "good"
    write_step(run / OUTCOMES_DIR, {"piqa": task_outcomes(0)}, 10)
    return run


def compare(capsys, *args: object) -> tuple[int, str, str]:
    status = main(["compare", *map(str, args)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize("side", ["A", "B"])
@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_side_exits_2_with_one_line_naming_the_file(good, tmp_path, capsys, case, side):
    damage, words = DAMAGED[case]
    bad = step_path(tmp_path / "bad" / OUTCOMES_DIR, 10)
    bad.parent.mkdir(parents=True)
    damage(bad)
    sides = (tmp_path / "bad", good) if side == "A" else (good, tmp_path / "bad")
    status, out, err = compare(capsys, *sides)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"inloop-eval: error: outcomes file {bad}: ") and words in err
    status, out, err = compare(capsys, *sides, "--json")
    assert status == 2
    error = json.loads(out)["error"]
    assert error.startswith(f"outcomes file {bad}: ") and words in error


def test_a_named_pipe_as_the_latest_step_is_refused_never_waited_on(good):
    """`compare RUN@10 RUN`, RUN's latest step a FIFO: in a process of its own, so that a compare that blocks
    fails the test after 60 s instead of hanging the run."""
    fifo = step_path(good / OUTCOMES_DIR, 20)
    os.mkfifo(fifo)
    proc = subprocess.run(
        [sys.executable, "-m", "inloop_eval.cli", "compare", f"{good}@10", str(good)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr == f"inloop-eval: error: outcomes file {fifo}: is a named pipe (FIFO), not a file\n"


@pytest.mark.parametrize("step", ["-1", "abc", "1e3", "", "²"])
def test_a_step_that_is_not_a_whole_number_is_refused(good, capsys, step):
    status, _, err = compare(capsys, f"{good}@{step}", good)
    assert status == 2
    assert f"{step!r} after '@' is not a step (a whole number >= 0)" in err and err.count("\n") == 1


def test_a_directory_whose_name_holds_an_at_sign_is_still_a_run(tmp_path, capsys):
    run = tmp_path / "exp@v2"
    write_step(run / OUTCOMES_DIR, {"piqa": task_outcomes(0)}, 10)
    status, out, _ = compare(capsys, run, f"{run}@10", "--json")
    assert status == 0 and json.loads(out)["b"]["step"] == 10


def test_figures_that_no_task_compares_are_refused_naming_those_held(good, capsys):
    status, out, err = compare(capsys, good, good, "--figures", "acc,nosuch", "--json")
    assert status == 2
    assert "--figures: ['nosuch'] compared in no task" in json.loads(out)["error"]
    assert "compare: acc, ce_gold" in err
    status, out, _ = compare(capsys, good, good, "--figures", "acc", "--json")
    assert status == 0 and list(json.loads(out)["tasks"]["piqa"]["figures"]) == ["acc"]
    assert compare(capsys, good, good, "--figures", ",")[0] == 2


def test_outcomes_holding_a_document_twice_are_never_paired():
    """Outcomes built in code (not read from a file) with a repeated id: refused, not mis-paired."""
    twice = dataclasses.replace(task_outcomes(0), doc_id=np.r_[np.arange(29), 3].astype(np.int64))
    a = StepOutcomes(10, {"piqa": twice}, "run-a")
    b = StepOutcomes(10, {"piqa": task_outcomes(1)}, "run-b")
    for sides in ((a, b), (b, a)):
        with pytest.raises(OutcomesError, match=r"run-a: task 'piqa': document id 3 is held more than once"):
            compare_steps(*sides)
