"""Launching real process groups from tests: torchrun with a free port, and a hard timeout that kills the
whole process tree, so a hang fails the test instead of hanging CI."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_env(**extra: str) -> dict[str, str]:
    """The environment for workers: one thread each (several processes share two cores)."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests" / "support"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def run_with_timeout(
    cmd: Sequence[str], *, timeout: float, env: dict[str, str] | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """Run `cmd` in its own session; on timeout kill the session (torchrun and all its workers) and raise
    with the output so far. A non-zero exit raises with the output too."""
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(
            f"{' '.join(cmd)} did not finish in {timeout:.0f}s (hang?); output:\n{out[-6000:]}"
        ) from None
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited with {proc.returncode}; output:\n{out[-6000:]}")
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, "")


def torchrun(
    nproc: int, args: Sequence[str], *, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`torchrun --nproc_per_node nproc ARGS` on 127.0.0.1 with a free port."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1"]
    cmd += ["--master_addr=127.0.0.1", f"--master_port={free_port()}", *args]
    return run_with_timeout(cmd, timeout=timeout, env=env or worker_env())
