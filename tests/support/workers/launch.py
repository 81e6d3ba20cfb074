"""The one way tests start a process group: `launch(n, args)` runs `python ARGS` as ranks 0..n-1, each a fresh
process with the environment torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT on a free port), one thread each, gloo on CPU.

What the launcher promises:
- every rank runs in its own session (process group), its stdout and stderr kept apart in files;
- a rank that exits non-zero leaves the others `FAILURE_GRACE_S` to exit on their own (to print what they
  saw), then their process groups are killed, as torchrun's agent kills its workers;
- past the timeout every rank's process group is killed (a hang fails the test instead of hanging CI);
- a rank that cannot start, fails or hangs raises `LaunchFailed`, which names each rank's exit and shows the
  tail of its stderr (so its traceback) and of its stdout;
- ranks pass results back through files: `checks_main` writes `<out>/rank<r>.json`, `read_ranks` reads them.

tests/test_launcher.py checks these promises, and that no other test module starts processes of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[3]
FAILURE_GRACE_S = 10.0
STDERR_TAIL_CHARS = 4000
STDOUT_TAIL_CHARS = 1500
POLL_S = 0.05


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_env(**extra: str) -> dict[str, str]:
    """The environment for workers: one thread each (several processes share two cores), tests/support on the
    path (so `workers.*`, `helpers`, `lm_helpers` import) and this checkout before it (so a worker imports
    this checkout's `inloop_eval`, not another one installed in the environment), unbuffered output, `extra`
    on top."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    path = [str(REPO), str(REPO / "tests" / "support"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(path).rstrip(os.pathsep)
    env.update(extra)
    return env


def rank_env(base: Mapping[str, str], rank: int, world_size: int, port: int) -> dict[str, str]:
    """`base` plus what torchrun sets for worker `rank` of a one-node job of `world_size` workers."""
    ranks = {"RANK": rank, "LOCAL_RANK": rank, "ROLE_RANK": rank, "GROUP_RANK": 0, "GROUP_WORLD_SIZE": 1}
    sizes = {"WORLD_SIZE": world_size, "LOCAL_WORLD_SIZE": world_size, "ROLE_WORLD_SIZE": world_size}
    job = {"ROLE_NAME": "default", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    return {**base, **{name: str(value) for name, value in {**ranks, **sizes, **job}.items()}}


@dataclass(frozen=True)
class RankRun:
    """How one rank ended: `returncode` None when the launcher killed it; its whole stdout and stderr."""

    rank: int
    returncode: int | None
    stdout: str
    stderr: str

    def describe(self) -> str:
        """The rank's exit and the tails of its stderr and stdout, for a failure message."""
        ended = "killed by the launcher" if self.returncode is None else f"exited with {self.returncode}"
        parts = [f"--- rank {self.rank}: {ended}; its stderr:", _tail(self.stderr, STDERR_TAIL_CHARS)]
        if self.stdout.strip():
            parts += [f"--- rank {self.rank}'s stdout:", _tail(self.stdout, STDOUT_TAIL_CHARS)]
        return "\n".join(parts)


class LaunchFailed(AssertionError):
    """A launch whose ranks did not all exit 0: `ranks` holds how each ended (what it printed included)."""

    def __init__(self, summary: str, ranks: Sequence[RankRun]) -> None:
        self.ranks = list(ranks)
        super().__init__("\n".join([summary, *(r.describe() for r in self.ranks)]))


def launch(
    nprocs: int,
    args: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    python: bool = True,
    cwd: Path = REPO,
    failure_grace_s: float = FAILURE_GRACE_S,
) -> list[RankRun]:
    """Run `python ARGS` (`ARGS` itself when `python` is False: a console script) as the `nprocs` ranks of one
    job on 127.0.0.1, as `torchrun --nproc_per_node nprocs ARGS` would, and wait for every rank.

    Args:
        nprocs: the world size.
        args: the script (or `-m module`) and its arguments, as torchrun takes them.
        timeout: seconds the whole launch may take; past it every rank is killed and the launch fails.
        env: the base environment (default `worker_env()`); the rank variables are set on top.
        python: prefix `args` with this interpreter.
        cwd: the ranks' working directory.
        failure_grace_s: how long the other ranks may run on once one has failed.

    Returns every rank's `RankRun` (all exited 0); raises `LaunchFailed` otherwise."""
    command = [sys.executable, *args] if python else list(args)
    base = worker_env() if env is None else env
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="launch-") as logs:
        ranks = _Ranks(Path(logs))
        try:
            failure = ranks.start(command, [rank_env(base, r, nprocs, port) for r in range(nprocs)], cwd)
            failure = failure or ranks.wait(timeout, failure_grace_s)
        finally:
            ranks.kill()  # nothing left to kill unless a rank failed or the test was interrupted
            ranks.close()
        runs = ranks.runs()
    if failure:
        raise LaunchFailed(f"{nprocs} rank(s) of {' '.join(command)}: {failure}", runs)
    return runs


def read_ranks(folder: Path, nprocs: int, name: str = "rank{rank}.json") -> list[Any]:
    """Every rank's JSON result `folder/name` (`name` formatted with `rank`); fails naming missing ones."""
    paths = [folder / name.format(rank=r) for r in range(nprocs)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise AssertionError(f"the ranks exited 0 but wrote no result: {missing} missing")
    return [json.loads(p.read_text()) for p in paths]


class _Ranks:
    """The processes of one launch, each in its own session, its output in `logs/rank<r>.out|err`."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.files: list[BinaryIO] = []
        self.killed: set[int] = set()

    def start(self, command: list[str], envs: list[dict[str, str]], cwd: Path) -> str:
        """Start one process per environment; "" when all started, else which could not (none left)."""
        for rank, env in enumerate(envs):
            out, err = (self.logs / f"rank{rank}.out").open("wb"), (self.logs / f"rank{rank}.err").open("wb")
            self.files += [out, err]
            try:
                proc = subprocess.Popen(
                    command,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
            except OSError as exc:
                self.kill()
                return f"could not start rank {rank}: {exc}"
            self.procs.append(proc)
        return ""

    def wait(self, timeout: float, grace: float) -> str:
        """Wait for every rank; "" when all exit 0, else why the launch failed (the rest killed)."""
        deadline = time.monotonic() + timeout
        failed_at: float | None = None
        while True:
            codes = [p.poll() for p in self.procs]
            bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if None not in codes:
                return f"rank(s) {bad} failed" if bad else ""
            now = time.monotonic()
            if bad and failed_at is None:
                failed_at = now
            if failed_at is not None and now - failed_at > grace:
                self.kill()
                return f"rank(s) {bad} failed; the ranks still running {grace:.0f}s later were killed"
            if now > deadline:
                self.kill()
                return f"did not finish in {timeout:.0f}s (a hang?); the ranks still running were killed"
            time.sleep(POLL_S)

    def kill(self) -> None:
        """SIGKILL the process group of every rank still running (its children with it) and reap it."""
        for rank, proc in enumerate(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                self.killed.add(rank)

    def close(self) -> None:
        for f in self.files:
            f.close()

    def runs(self) -> list[RankRun]:
        """How each started rank ended, with all it wrote."""
        return [
            RankRun(r, None if r in self.killed else p.returncode, self._read(r, "out"), self._read(r, "err"))
            for r, p in enumerate(self.procs)
        ]

    def _read(self, rank: int, stream: str) -> str:
        return (self.logs / f"rank{rank}.{stream}").read_bytes().decode(errors="replace")


def _tail(text: str, chars: int) -> str:
    return text if len(text) <= chars else "..." + text[-chars:]


def run_with_timeout(
    cmd: Sequence[str], *, timeout: float, env: dict[str, str] | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """Run one process (no process group: the single-process reference of a launch) in its own session; on
    timeout kill the session and raise with the output so far. A non-zero exit raises with the output too."""
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


def checks_main(checks: Mapping[str, Callable[[Any], Any]], make_context: Callable[[Path], Any]) -> None:
    """The body of a launched worker script: `--data-root DIR --out DIR --checks a,b`; runs each named check
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
        result = json.dumps(results, indent=1, sort_keys=True)
        (Path(args.out) / f"rank{dist.get_rank()}.json").write_text(result)
        dist.barrier()
    finally:
        dist.destroy_process_group()
