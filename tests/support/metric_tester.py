"""A MetricTester in the manner of torchmetrics': run `ICLMetric` on one process and on several gloo
processes over the same rows, split across ranks, and compare every result with the independent NumPy
reference (tests/reference.py) computed on all rows at once.

Rows are split by document as the evaluator splits them: each rank gets some documents (so ranks hold
different numbers of rows), a few documents are repeated on a second rank (DistributedSampler padding), rows
arrive in a shuffled order, and the last rank can be given no rows at all, updating with empty tensors as
the evaluator does or never updating. If the processes cannot start or do not finish, the tester raises: it never
skips.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from reference import FIELDS, reference_icl
from workers.launch import launch, read_ranks, worker_env

from inloop_eval.metrics.icl_metric import ICLMetric

ACC_KEYS = ("acc", "acc_norm", "acc_bytes", "acc_per_token", "acc_pmi", "n_docs", "n_skipped_docs")
START_TIMEOUT_S = 240.0
WORKER = Path(__file__).resolve().parent / "workers" / "metric_ranks.py"


class MetricTesterError(RuntimeError):
    """The tester's processes did not start, crashed or did not finish: a failure, never a skip."""


@dataclass
class MetricCase:
    """Rows of one task (REQUEST_FIELDS, [R] each) and its scored unconditional pairs."""

    name: str
    rows: dict[str, np.ndarray]
    uncond_id: np.ndarray
    uncond_ll: np.ndarray
    metrics: tuple[str, ...]
    empty_last_rank: bool = False
    update_when_empty: bool = True
    """False: a rank without rows (or unconditional pairs) never calls `update` (or `update_uncond`)."""
    seed: int = 0
    split: dict[int, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)

    def shard(self, world_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """(request rows, unconditional entries) of each rank: documents dealt round-robin in a shuffled
        order, some repeated on another rank, rows shuffled within a rank."""
        if world_size in self.split:
            return self.split[world_size]
        rng = np.random.default_rng(self.seed + world_size)
        docs = rng.permutation(np.unique(self.rows["doc_id"]))
        holders = world_size - 1 if (self.empty_last_rank and world_size > 1) else world_size
        by_rank: list[list[int]] = [[] for _ in range(world_size)]
        for i, d in enumerate(docs):
            by_rank[i % holders].append(int(d))
        if holders > 1:
            for d in docs[: max(1, len(docs) // 5)]:  # sampler padding: a document scored twice
                by_rank[int(rng.integers(holders))].append(int(d))
        uncond_rank = rng.integers(holders, size=len(self.uncond_id))
        out = []
        for rank in range(world_size):
            rows = np.flatnonzero(np.isin(self.rows["doc_id"], by_rank[rank]))
            out.append((rng.permutation(rows), np.flatnonzero(uncond_rank == rank)))
        self.split[world_size] = out
        return out


def random_case(
    name: str,
    seed: int,
    metrics: Sequence[str],
    *,
    n_docs: int = 30,
    empty_last_rank: bool = False,
    update_when_empty: bool = True,
) -> MetricCase:
    """Random documents with 1-5 choices, ties, several golds, missing requests and NaN scores."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list[Any]] = {f: [] for f in FIELDS}
    n_uncond = 6
    for d in range(n_docs):
        k = int(rng.integers(1, 6))
        gold = set(rng.choice(k, size=1 if rng.random() < 0.8 else min(2, k), replace=False).tolist())
        drop = int(rng.integers(k)) if rng.random() < 0.1 else -1  # a document missing a request
        for c in range(k):
            if c == drop:
                continue
            ll = float(np.round(rng.normal(-8, 3), 0 if rng.random() < 0.2 else 6))  # ties, sometimes
            if rng.random() < 0.03:
                ll = math.nan
            n_chars = int(rng.integers(1, 30))
            row = {
                "doc_id": d * 7 + 3,  # ids need not be dense
                "cont_id": c,
                "n_choices": k,
                "is_gold": c in gold,
                "ll": ll,
                "uncond_id": int(rng.integers(n_uncond)) if "acc_pmi" in metrics else -1,
                "n_tokens": int(rng.integers(1, 6)),
                "n_chars": n_chars,
                "n_bytes": n_chars + int(rng.integers(0, 4)),
                "is_greedy": bool(rng.random() < 0.3),
            }
            for f in FIELDS:
                cols[f].append(row[f])
    dtypes = {"ll": np.float64, "is_gold": bool, "is_greedy": bool}
    rows = {f: np.asarray(v, dtype=dtypes.get(f, np.int64)) for f, v in cols.items()}
    uncond_id = np.arange(n_uncond, dtype=np.int64) if "acc_pmi" in metrics else np.zeros(0, np.int64)
    uncond_ll = rng.normal(-6, 2, size=len(uncond_id))
    return MetricCase(
        name,
        rows,
        uncond_id,
        uncond_ll,
        tuple(metrics),
        empty_last_rank=empty_last_rank,
        update_when_empty=update_when_empty,
        seed=seed,
    )


def feed(metric: ICLMetric, case: MetricCase, rows: np.ndarray, uncond: np.ndarray) -> None:
    """The case's `rows` and unconditional pairs `uncond` (indices) through `metric`'s updates."""
    t = torch.from_numpy
    if case.update_when_empty or len(rows):
        metric.update(**{f: t(np.ascontiguousarray(case.rows[f][rows])) for f in FIELDS})
    if case.update_when_empty or len(uncond):
        metric.update_uncond(t(case.uncond_id[uncond]), t(case.uncond_ll[uncond]))


@dataclass(frozen=True)
class CasesJob:
    """Every case through a fresh metric on this rank: its `compute()` by case name."""

    cases: list[MetricCase]
    factory: Callable[[Sequence[str]], ICLMetric] = ICLMetric

    def __call__(self, rank: int, world_size: int) -> dict[str, Any]:
        results = {}
        for case in self.cases:
            metric = self.factory(case.metrics)
            feed(metric, case, *case.shard(world_size)[rank])
            results[case.name] = metric.compute()
        return results


def run_job_in_processes(
    job: Callable[[int, int], dict[str, Any]],
    world_size: int,
    *,
    backend: str = "gloo",
    timeout: float = START_TIMEOUT_S,
) -> list[dict[str, Any]]:
    """Every rank's `job(rank, world_size)` (a JSON-able dict; `job` picklable), from `world_size` launched
    processes in one process group (`workers/metric_ranks.py`). MetricTesterError when they do not run."""
    with tempfile.TemporaryDirectory(prefix="metric_tester_") as folder:
        out = Path(folder)
        torch.save(job, out / "job.pt")
        args = [str(WORKER), "--job", str(out / "job.pt"), "--backend", backend, "--out", str(out)]
        try:
            launch(world_size, args, timeout=timeout, env=worker_env())
            return read_ranks(out, world_size)
        except AssertionError as exc:  # LaunchFailed, or a rank without its result
            raise MetricTesterError(f"the {world_size} metric processes failed to run: {exc}") from exc


def run_in_processes(
    cases: list[MetricCase],
    world_size: int,
    *,
    factory: Callable[[Sequence[str]], ICLMetric] = ICLMetric,
    backend: str = "gloo",
    timeout: float = START_TIMEOUT_S,
) -> list[dict[str, dict[str, float]]]:
    """Every rank's `compute()` of every case, from `world_size` launched processes in one gloo group."""
    return run_job_in_processes(CasesJob(cases, factory), world_size, backend=backend, timeout=timeout)


def run_in_this_process(
    cases: list[MetricCase], factory: Callable[[Sequence[str]], ICLMetric] = ICLMetric
) -> dict[str, dict[str, float]]:
    """World size 1, without a process group: all rows through one metric."""
    return CasesJob(cases, factory)(0, 1)


def assert_matches_reference(found: dict[str, float], case: MetricCase, where: str) -> None:
    expected = reference_icl(case.rows, case.uncond_id, case.uncond_ll, case.metrics)
    assert sorted(found) == sorted(expected), f"{where}: keys {sorted(found)} != {sorted(expected)}"
    for key, value in expected.items():
        got = found[key]
        if math.isnan(value):
            assert math.isnan(got), f"{where}: {key} = {got}, expected NaN"
        elif key in ACC_KEYS:
            assert got == value, f"{where}: {key} = {got}, expected {value}"
        else:
            assert math.isclose(got, value, rel_tol=1e-9, abs_tol=1e-12), f"{where}: {key} = {got} != {value}"


def check_metric(
    cases: list[MetricCase],
    world_sizes: Sequence[int] = (1, 2),
    *,
    factory: Callable[[Sequence[str]], ICLMetric] = ICLMetric,
    backend: str = "gloo",
) -> None:
    """The tester: every case on every world size (1 in this process, more in gloo processes), every
    rank's result against the reference. Raises AssertionError on a mismatch, MetricTesterError when the
    processes do not run."""
    for world_size in world_sizes:
        if world_size == 1:
            per_rank = [run_in_this_process(cases, factory)]
        else:
            per_rank = run_in_processes(cases, world_size, factory=factory, backend=backend)
        for rank, results in enumerate(per_rank):
            for case in cases:
                assert_matches_reference(
                    results[case.name], case, f"case {case.name!r} world size {world_size} rank {rank}"
                )
