"""Damaged, edited and stale outcome files: each refused in one line naming the file and what is wrong,
only the members the format names read, and a rewrite that fails never leaving an earlier evaluation's
file to be read as the step's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from outcome_files import DAMAGED, good_arrays, save, task_outcomes

from inloop_eval.compare.pairing import load_side
from inloop_eval.loggers.outcomes import (
    OUTCOMES_DIR,
    OutcomesError,
    list_steps,
    read_step,
    step_path,
    write_step,
)


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_file_is_refused_in_one_line_naming_it(tmp_path, case):
    damage, words = DAMAGED[case]
    path = tmp_path / "step_10.npz"
    damage(path)
    with pytest.raises(OutcomesError) as caught:
        read_step(path)
    message = str(caught.value)
    assert message.startswith(f"outcomes file {path}: ") and words in message, message
    assert "\n" not in message


def test_a_named_pipe_is_refused_at_once_never_waited_on(tmp_path):
    """In a process of its own, so that a reader that blocks fails the test (after 60 s) instead of
    hanging the run."""
    fifo = tmp_path / "step_10.npz"
    os.mkfifo(fifo)
    script = "import sys; from inloop_eval.loggers.outcomes import read_step; read_step(__import__('pathlib').Path(sys.argv[1]))"
    proc = subprocess.run([sys.executable, "-c", script, str(fifo)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert f"outcomes file {fifo}: is a named pipe (FIFO), not a file" in proc.stderr


def test_a_directory_named_as_a_step_file_is_refused_saying_so(tmp_path):
    (tmp_path / "step_10.npz").mkdir()
    with pytest.raises(OutcomesError, match=r"step_10.npz: is a directory, not a file"):
        read_step(tmp_path / "step_10.npz")


def test_a_file_holding_another_step_than_its_name_is_refused(tmp_path):
    path = save(tmp_path / "step_7.npz", good_arrays(step=10))
    with pytest.raises(OutcomesError, match=r"step_7.npz: holds step 10 but is named for step 7; .* step_10.npz"):
        read_step(path)


def test_only_the_members_the_format_names_are_read(tmp_path):
    """A small file with a 256 MiB member of zeros the format does not name: reading it takes a few KiB
    of memory (np.load's archive read every member, that one too)."""
    path = save(tmp_path / "step_10.npz", good_arrays())
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("zeros.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(
                member, {"descr": "|u1", "fortran_order": False, "shape": (256 << 20,)}
            )
            block = bytes(1 << 20)
            for _ in range(256):
                member.write(block)
    assert path.stat().st_size < 2 << 20
    tracemalloc.start()
    try:
        step = read_step(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert step.tasks["piqa"].values["acc"].shape == (30,)
    assert peak < 8 << 20, peak


def test_a_suite_file_keys_documents_by_task_and_id(tmp_path):
    """Pooled outcomes may repeat an id across tasks; the same (task, id) twice is refused."""
    arrays = good_arrays()
    arrays["t0.doc_task"] = np.array(["piqa"] * 15 + ["copa"] * 15)
    arrays["t0.doc_id"] = np.r_[np.arange(15), np.arange(15)].astype(np.int64)
    assert read_step(save(tmp_path / "step_10.npz", arrays)).tasks["piqa"].doc_task is not None
    arrays["t0.doc_id"][-1] = 13
    with pytest.raises(OutcomesError, match=r"document 'copa' id 13 is held more than once"):
        read_step(save(tmp_path / "step_10.npz", arrays))


# A run resumed from before step 0's checkpoint evaluates step 0 again, on a disk (here a file-size limit)
# with room for the metrics line but not the outcomes file.
_RESUMED_ON_A_FULL_DISK = """
import os, resource, signal, sys
from outcome_files import task_outcomes
from inloop_eval.loggers import JSONLLogger

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write with EFBIG instead of killing the process
run = sys.argv[1]
with JSONLLogger(run) as first:
    first.log({"eval/downstream/piqa/acc": 0.55}, 0)
    first.log_outcomes({"piqa": task_outcomes(0, n=4000)}, 0)
hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(os.path.join(run, "metrics.jsonl")) + 200, hard))
with JSONLLogger(run) as resumed:
    resumed.log({"eval/downstream/piqa/acc": 0.45}, 0)
    resumed.log_outcomes({"piqa": task_outcomes(1, n=4000)}, 0)
"""


def test_a_rewrite_that_fails_removes_the_earlier_file_of_its_step(tmp_path):
    run = tmp_path / "run"
    support = str(Path(__file__).parents[1] / "support")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([support, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", _RESUMED_ON_A_FULL_DISK, str(run)], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [line["eval/downstream/piqa/acc"] for line in lines] == [0.55, 0.45]
    assert not step_path(run / OUTCOMES_DIR, 0).exists()
    assert "per-document outcomes of step 0 not written" in proc.stderr
    assert f"the earlier {step_path(run / OUTCOMES_DIR, 0)} (an earlier evaluation of step 0) was removed" in proc.stderr
    assert not [p for p in (run / OUTCOMES_DIR).iterdir()]  # no temporary file left either
    with pytest.raises(OutcomesError, match="no per-document outcomes"):
        load_side(f"{run}@0")


def test_a_failed_write_of_a_new_step_leaves_the_other_steps(tmp_path):
    write_step(tmp_path, {"piqa": task_outcomes(0)}, 10)
    (tmp_path / "step_20.npz").mkdir()  # the rename onto it fails
    with pytest.raises(OSError):
        write_step(tmp_path, {"piqa": task_outcomes(1)}, 20)
    assert list(list_steps(tmp_path)) == [10, 20] and read_step(tmp_path / "step_10.npz").step == 10
