"""Our task metric alone against the per-request Python metric of OLMo's in-loop evaluator, on every
request of a task (all of HellaSwag validation by default: 40,168 requests), with seeded random scores.

- `ours`: `ICLMetric` (flat tensor states, one sync) fed every request's fields, then `compute`: in one
  process, and over two gloo processes (documents dealt round-robin, update + sync + compute, the slower
  rank's seconds, best of three).
- `naive`: dicts per document, argmax and accuracy by Python loops, in one process.

    python -m benchmarks.metric
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/metric.py`: import `benchmarks` as `-m` would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.common import naive_accuracy, task_requests
from inloop_eval.data.root import default_data_root, neox_tokenizer_path
from inloop_eval.data.tokenizer import load_tokenizer
from inloop_eval.metrics.icl_metric import ICLMetric
from inloop_eval.metrics.registry import needs_uncond
from inloop_eval.requests.table import RequestTable
from inloop_eval.tasks import get_task


def synthetic_scores(table: RequestTable, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random loglikelihoods and greedy flags for every request of a table, then every
    unconditional request."""
    rng = np.random.default_rng(seed)
    n = len(table) + len(table.uncond)
    return -rng.gamma(4.0, 5.0, n), rng.random(n) < 0.1


def time_metric(
    table: RequestTable, ll: np.ndarray, greedy: np.ndarray, metrics: tuple[str, ...], rank: int, world: int
) -> float:
    """Seconds of update + sync + compute for this rank's share (documents dealt round-robin)."""
    rows = table.rows_of_docs(np.unique(table.doc_id)[rank::world])
    uncond_ids = np.arange(len(table.uncond))[rank::world]
    t = torch.from_numpy
    t0 = time.perf_counter()
    metric = ICLMetric(metrics)
    metric.update(
        doc_id=t(table.doc_id[rows]),
        cont_id=t(table.cont_id[rows]),
        n_choices=t(table.n_choices[rows]),
        is_gold=t(table.is_gold[rows]),
        ll=t(ll[rows]),
        uncond_id=t(table.uncond_id[rows]),
        n_tokens=t(table.pairs.cont_len[rows]),
        n_chars=t(table.n_chars[rows]),
        n_bytes=t(table.n_bytes[rows]),
        is_greedy=t(greedy[rows]),
    )
    metric.update_uncond(t(uncond_ids), t(ll[len(table) + uncond_ids]))
    metric.compute()
    return time.perf_counter() - t0


def metric_worker(rank: int, world: int, path: str, port: int, out: str) -> None:
    """One gloo rank: three timed update + sync + compute, rank 0 writing the slower rank's seconds."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # the cores shared out among the ranks
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    with open(path, "rb") as f:
        table, ll, greedy, metrics = pickle.load(f)
    runs = []
    for _ in range(3):  # the first sync also sets up gloo's buffers: report the best of three
        dist.barrier()
        seconds = time_metric(table, ll, greedy, metrics, rank, world)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, seconds)
        runs.append(max(gathered))
    if rank == 0:
        Path(out).write_text(json.dumps(runs))
    dist.destroy_process_group()


def two_processes(table: RequestTable, ll: np.ndarray, greedy: np.ndarray, metrics: tuple[str, ...]) -> list[float]:
    """`metric_worker` on two gloo processes; the seconds of each of its three runs."""
    with tempfile.TemporaryDirectory() as tmp:
        path, out = f"{tmp}/inputs.pkl", f"{tmp}/out.json"
        with open(path, "wb") as f:
            pickle.dump((table, ll, greedy, metrics), f)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(metric_worker, args=(2, path, port, out), nprocs=2, join=True)
        return json.loads(Path(out).read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="hellaswag")
    parser.add_argument("--limit", type=int, default=None, help="documents (default: the whole split)")
    parser.add_argument("--data-root", default=None, help="default: $INLOOP_EVAL_DATA or the cache")
    parser.add_argument("--output", default="bench_metric.json")
    args = parser.parse_args(argv)

    data_root = Path(args.data_root) if args.data_root else default_data_root()
    tokenizer = load_tokenizer(neox_tokenizer_path(data_root))
    metrics = get_task(args.task).metrics
    t0 = time.perf_counter()
    table = task_requests(args.task, tokenizer, data_root, args.limit, with_uncond=needs_uncond(metrics))
    tokenize_s = time.perf_counter() - t0
    ll, greedy = synthetic_scores(table)
    one = min(time_metric(table, ll, greedy, metrics, 0, 1) for _ in range(3))
    keys = zip(table.doc_id.tolist(), table.cont_id.tolist(), strict=True)
    t0 = time.perf_counter()
    naive_accuracy(table, dict(zip(keys, ll[: len(table)].tolist(), strict=True)), {})
    naive_s = time.perf_counter() - t0
    two = two_processes(table, ll, greedy, metrics)
    report = {
        "task": args.task,
        "requests": len(table),
        "unconditional_requests": len(table.uncond),
        "documents": len(np.unique(table.doc_id)),
        "load_and_tokenize_s": tokenize_s,
        "metric_update_compute_s_1proc": one,
        "metric_update_sync_compute_s_2proc_gloo": min(two),
        "metric_update_sync_compute_s_2proc_gloo_runs": two,
        "naive_python_metric_compute_s": naive_s,
    }
    print(json.dumps(report, indent=1))
    Path(args.output).write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
