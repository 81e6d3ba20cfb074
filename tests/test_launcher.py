"""The launcher every multi-process test uses (tests/support/workers/launch.py): every rank's result comes
back, a rank that raises fails the launch with its traceback, a rank that hangs is killed with its children at
the timeout and named, a rank that cannot start fails at once; and no other test module starts processes of
its own (mp.spawn, start_processes, a process pool, torchrun, a hand-made MASTER_PORT)."""

from __future__ import annotations

import ast
import os
import time
from pathlib import Path

import pytest
from workers.launch import REPO, LaunchFailed, launch, read_ranks

PROBE = str(REPO / "tests" / "support" / "workers" / "launcher_probe.py")
LAUNCHER = REPO / "tests" / "support" / "workers" / "launch.py"
# Modules that still start their processes themselves: the metric tester, until it moves to the launcher.


def test_every_rank_joins_one_gloo_group_and_its_result_comes_back(tmp_path):
    runs = launch(2, [PROBE, "--out", str(tmp_path), "--does", "sum"], timeout=240)
    assert [(r.rank, r.returncode) for r in runs] == [(0, 0), (1, 0)]
    for rank, seen in enumerate(read_ranks(tmp_path, 2)):
        assert seen["rank"] == rank and seen["world_size"] == 2 and seen["sum"] == 1 + 2
        expected = {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": 2, "LOCAL_WORLD_SIZE": 2}
        assert seen["env"] == {**{k: str(v) for k, v in expected.items()}, "MASTER_ADDR": "127.0.0.1"}


def test_a_missing_result_is_named(tmp_path):
    (tmp_path / "rank0.json").write_text("{}")
    with pytest.raises(AssertionError, match=r"rank1\.json'\] missing"):
        read_ranks(tmp_path, 2)


def test_a_rank_that_raises_fails_the_launch_with_its_traceback(tmp_path):
    """Rank 1 raises while rank 0 waits as if in a collective: rank 0 is killed after the grace period."""
    args = [PROBE, "--out", str(tmp_path), "--does", "raise", "--rank-that", "1"]
    started = time.monotonic()
    with pytest.raises(LaunchFailed, match=r"rank\(s\) \[1\] failed") as failure:
        launch(2, args, timeout=120, failure_grace_s=1)
    assert time.monotonic() - started < 60, "the waiting rank ran on to the timeout"
    rank0, rank1 = failure.value.ranks
    assert rank0.returncode is None and rank1.returncode == 1
    assert "Traceback (most recent call last)" in rank1.stderr
    message = str(failure.value)
    assert "--- rank 1: exited with 1" in message and "RuntimeError: rank 1 raised on purpose" in message
    assert "--- rank 0: killed by the launcher" in message


def test_a_rank_that_hangs_is_killed_with_its_children_at_the_timeout(tmp_path):
    args = [PROBE, "--out", str(tmp_path), "--does", "hang", "--rank-that", "1"]
    with pytest.raises(LaunchFailed, match=r"did not finish in 10s \(a hang\?\)") as failure:
        launch(2, args, timeout=10)
    rank0, rank1 = failure.value.ranks
    assert rank0.returncode == 0 and rank1.returncode is None
    assert "--- rank 1: killed by the launcher; its stderr:\nrank 1 is hanging" in str(failure.value)
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 10
    while is_running(child):  # killed with its rank's process group; init reaps it
        assert time.monotonic() < deadline, f"the hanging rank's child {child} outlived the launch"
        time.sleep(0.1)


def test_a_rank_that_cannot_start_fails_the_launch():
    with pytest.raises(LaunchFailed, match="could not start rank 0: .*no-such-program"):
        launch(2, ["/no-such-program"], timeout=10, python=False)


def is_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ---- one launcher ----------------------------------------------------------------------------------------

LAUNCHING_CALLS = {"spawn", "start_processes", "get_context", "Pool", "Process", "elastic_launch"}
LAUNCHING_MODULES = (
    "multiprocessing",
    "torch.multiprocessing",
    "torch.distributed.run",
    "torch.distributed.launch",
)
LAUNCHING_STRINGS = {"torchrun", "torch.distributed.run", "torch.distributed.launch", "MASTER_PORT"}


def own_launches(source: str) -> list[str]:
    """What in `source` starts processes without the launcher: a multiprocessing import or call, torchrun's
    module or command, a process group's port or `init_method` set by hand."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        found += [f"line {node.lineno}: imports {n}" for n in names if n.startswith(LAUNCHING_MODULES)]
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in LAUNCHING_CALLS:
                found.append(f"line {node.lineno}: calls {name}")
            found += [
                f"line {node.lineno}: passes init_method" for k in node.keywords if k.arg == "init_method"
            ]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in LAUNCHING_STRINGS or node.value.startswith("--nproc"):
                found.append(f"line {node.lineno}: {node.value!r}")
    return found


def test_the_check_finds_each_way_of_launching():
    source = """
import torch.multiprocessing as mp
from multiprocessing import get_context
mp.spawn(work, nprocs=2)
mp.start_processes(work, nprocs=2, start_method="forkserver")
subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "w.py"])
subprocess.run(["torchrun", "w.py"], env={"MASTER_PORT": "29500"})
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:1", rank=0, world_size=1)
"""
    found = " ".join(own_launches(source))
    for what in (
        "imports torch.multiprocessing",
        "imports multiprocessing",
        "calls spawn",
        "calls start_processes",
    ):
        assert what in found
    for what in (
        "'torch.distributed.run'",
        "'--nproc_per_node=2'",
        "'torchrun'",
        "'MASTER_PORT'",
        "init_method",
    ):
        assert what in found
    assert own_launches("launch(2, [worker, '--out', str(out)], timeout=60)") == []


def test_no_test_module_starts_processes_but_the_launcher():
    offenders = {}
    for path in sorted((REPO / "tests").rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        if path in (LAUNCHER, Path(__file__)):
            continue
        found = own_launches(path.read_text())
        if found:
            offenders[name] = found
    assert not offenders, f"start processes with workers.launch.launch, not by hand: {offenders}"


def test_launched_ranks_do_not_inherit_this_process_group_variables(monkeypatch, tmp_path):
    """A test run under torchrun itself must not leak its own RANK into the ranks it launches."""
    monkeypatch.setenv("RANK", "7")
    monkeypatch.setenv("WORLD_SIZE", "9")
    runs = launch(2, ["-c", "import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'])"], timeout=60)
    assert [r.stdout.split() for r in runs] == [["0", "2"], ["1", "2"]]
    assert os.environ["RANK"] == "7"
