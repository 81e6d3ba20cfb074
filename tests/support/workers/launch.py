"""Launching real process groups from tests: torchrun with a free port, and a hard timeout that kills the
whole process tree, so a hang fails the test instead of hanging CI."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

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


def checks_main(checks: Mapping[str, Callable[[Any], Any]], make_context: Callable[[Path], Any]) -> None:
    """The body of a torchrun worker script: `--data-root DIR --out DIR --checks a,b`; runs each named check
    on one context over gloo and writes `<out>/rank<r>.json` (check name -> its JSON-able result)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--checks", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        ctx = make_context(Path(args.data_root))
        results = {name: checks[name](ctx) for name in args.checks.split(",")}
        (Path(args.out) / f"rank{dist.get_rank()}.json").write_text(json.dumps(results, indent=1, sort_keys=True))
        dist.barrier()
    finally:
        dist.destroy_process_group()
