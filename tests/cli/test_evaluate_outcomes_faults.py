"""`inloop-eval evaluate --outcomes`: a step that is none, `--step` alone, a directory where the step file
goes, and a disk that fills after the figures are printed."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from inloop_eval.cli.main import main
from inloop_eval.loggers.outcomes import OUTCOMES_DIR, read_step, step_path


@pytest.mark.parametrize("step", ["-1", "abc", "2.5"])
def test_a_step_that_is_not_a_whole_number_is_refused_at_the_command_line(tmp_path, capsys, step):
    with pytest.raises(SystemExit) as caught:
        main(["evaluate", "--model", str(tmp_path), "--tasks", "piqa", "--outcomes", str(tmp_path), "--step", step])
    assert caught.value.code == 2
    assert f"argument --step: expected a step, a whole number >= 0, found {step!r}" in capsys.readouterr().err


def test_step_without_outcomes_is_refused(tmp_path, capsys):
    assert main(["evaluate", "--model", str(tmp_path), "--tasks", "piqa", "--step", "5"]) == 2
    assert "--step 5 files outcomes under a step; add --outcomes DIR" in capsys.readouterr().err


def test_a_directory_where_the_step_file_goes_is_named_with_the_fix(tmp_path, capsys):
    step_path(tmp_path / OUTCOMES_DIR, 0).mkdir(parents=True)
    assert main(["evaluate", "--model", str(tmp_path), "--tasks", "piqa", "--outcomes", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "step_0.npz is a directory; remove it (the step's file is written there)" in err
    assert "results.json" not in err


# `inloop-eval evaluate` under a file-size limit of 100 bytes: the figures print, the files cannot be written.
_FULL_DISK = """
import resource, signal, sys
from inloop_eval.cli.main import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write with EFBIG instead of killing the process
resource.setrlimit(resource.RLIMIT_FSIZE, (100, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.exit(main(sys.argv[1:]))
"""


def test_a_full_disk_after_the_figures_is_one_line_and_leaves_no_stale_step(tmp_path, hf_model_dir, data_root):
    args = ["evaluate", "--model", str(hf_model_dir), "--tasks", "piqa", "--limit", "4", "--data-root"]
    args += [str(data_root), "--outcomes", str(tmp_path / "run"), "--output", str(tmp_path / "results.json")]
    assert main(args) == 0
    assert read_step(step_path(tmp_path / "run" / OUTCOMES_DIR, 0)).step == 0
    proc = subprocess.run([sys.executable, "-c", _FULL_DISK, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    # The figures' table: a row per figure of the task, its label on the first.
    assert re.search(r"^downstream +piqa ", proc.stdout, re.M) and re.search(r"^ +acc +[0-9.]+", proc.stdout, re.M)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"inloop-eval: error: evaluate: --output {tmp_path / 'results.json'} not written")
    assert "--outcomes" in last and "was removed" in last and "(the figures are printed above)" in last
    assert "Traceback" not in proc.stderr
    assert not step_path(tmp_path / "run" / OUTCOMES_DIR, 0).exists()
