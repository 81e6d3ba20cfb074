"""A task's metric sync over gloo ranks: `ICLMetric` (a torchmetrics `Metric`: a task's rows in one int64 and
one float64 state) against the hand-written sync it replaced (`SyncedMetric`, copied below as the baseline:
twelve flat states, each gathered as its lengths then its values), in the same process group, at 1, 2 and 4
ranks; and perplexity labels (`PerplexityMetric`: three sums in one state, all labels synced in one all-reduce
by `PerplexityMetric.compute_labels` as the evaluator syncs them, against three all-reduces a label).

Each rank puts its share of a task's requests (all of HellaSwag validation by default; documents dealt
round-robin; seeded random scores) into both metrics. Then, `--repeats` times, the two take turns going first:
- `sync_s`: the sync alone, forced over the group even of one rank (ours: `Metric.sync()`, which also copies
  the states it puts back afterwards; the baseline: its gathers);
- `compute_s`: `compute` as the evaluator makes it (syncing over two ranks or more, never alone): the sync
  and the figures, which must agree between the two.
A figure is the slowest rank's seconds, the least over the repeats (and their median); `collectives` counts
the torch.distributed calls of one sync.

    python -m benchmarks.metric --world-sizes 1,2,4
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/metric.py`: import `benchmarks` as `-m` would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from benchmarks.common import task_requests
from inloop_eval.data.root import default_data_root, neox_tokenizer_path
from inloop_eval.data.tokenizer import load_tokenizer
from inloop_eval.metrics.icl import REQUEST_FIELDS, icl_evaluate
from inloop_eval.metrics.icl_metric import ICLMetric
from inloop_eval.metrics.perplexity import perplexity_compute, perplexity_update
from inloop_eval.metrics.perplexity_metric import PerplexityMetric
from inloop_eval.metrics.registry import needs_uncond
from inloop_eval.requests.table import RequestTable
from inloop_eval.tasks import get_task

# ---- the baseline: the sync of the former `metrics/synced.py`, as it was


def all_gather_cat(local_N: Tensor) -> Tensor:
    """Every rank's 1-D tensor (lengths may differ) concatenated in rank order, on every rank."""
    world_size = dist.get_world_size()
    length = torch.tensor([local_N.numel()], dtype=torch.long, device=local_N.device)
    lengths = [torch.zeros_like(length) for _ in range(world_size)]
    dist.all_gather(lengths, length)
    longest = max(int(n) for n in lengths)
    padded = torch.zeros(longest, dtype=local_N.dtype, device=local_N.device)
    padded[: local_N.numel()] = local_N
    parts = [torch.zeros_like(padded) for _ in range(world_size)]
    dist.all_gather(parts, padded)
    return torch.cat([part[: int(n)] for part, n in zip(parts, lengths, strict=True)])


class BaselineICL:
    """The former `ICLMetric` on `SyncedMetric`: one list of 1-D tensors per request field and two for the
    unconditional pairs, each concatenated across ranks by `all_gather_cat`."""

    def __init__(self, metrics: tuple[str, ...]) -> None:
        self.metrics = metrics
        self.dtypes = {name: torch.float64 if name == "ll" else torch.long for name in REQUEST_FIELDS}
        self.dtypes |= {"uncond_uid": torch.long, "uncond_ll": torch.float64}
        self.states: dict[str, list[Tensor]] = {name: [] for name in self.dtypes}

    def update(self, uncond_uid: Tensor, uncond_ll: Tensor, **fields: Tensor) -> None:
        for name, value in {**fields, "uncond_uid": uncond_uid, "uncond_ll": uncond_ll}.items():
            self.states[name].append(value.reshape(-1).to(self.dtypes[name]))

    def local(self, name: str) -> Tensor:
        parts = self.states[name]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=self.dtypes[name])

    def sync(self, syncing: bool) -> dict[str, Tensor]:
        return {name: all_gather_cat(self.local(name)) if syncing else self.local(name) for name in self.dtypes}

    def compute(self, syncing: bool) -> dict[str, float]:
        states = self.sync(syncing)
        dtypes = {"is_gold": torch.bool, "is_greedy": torch.bool}
        requests = {name: states[name].to(dtypes.get(name, self.dtypes[name])) for name in REQUEST_FIELDS}
        return icl_evaluate(requests, states["uncond_uid"], states["uncond_ll"], self.metrics)[0]


def baseline_perplexity(nll_S: Tensor, n_tokens_S: Tensor, n_bytes_S: Tensor, syncing: bool) -> dict[str, float]:
    """The former `PerplexityMetric` on `SyncedMetric`: three sums, each all-reduced."""
    sums = [t.clone() for t in perplexity_update(nll_S, n_tokens_S, n_bytes_S)]
    for total in sums if syncing else []:
        dist.all_reduce(total)
    return perplexity_compute(float(sums[0]), int(sums[1]), int(sums[2]))


# ---- timing on one rank


@contextmanager
def counted_collectives() -> Iterator[list[int]]:
    """Count calls of torch.distributed's barrier, all_gather and all_reduce (the real ones still run)."""
    count = [0]
    names = ("barrier", "all_gather", "all_reduce")
    real = {name: getattr(dist, name) for name in names}

    def counting(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            return fn(*args, **kwargs)

        return call

    for name in names:
        setattr(dist, name, counting(real[name]))
    try:
        yield count
    finally:
        for name in names:
            setattr(dist, name, real[name])


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    dist.barrier()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def rank_share(table: RequestTable, ll: np.ndarray, greedy: np.ndarray, rank: int, world: int) -> dict[str, Tensor]:
    """This rank's requests (documents dealt round-robin) and unconditional pairs, as update keywords."""
    rows = table.rows_of_docs(np.unique(table.doc_id)[rank::world])
    uids = np.arange(len(table.uncond))[rank::world]
    t = torch.from_numpy
    columns = {
        "doc_id": table.doc_id, "cont_id": table.cont_id, "n_choices": table.n_choices, "is_gold": table.is_gold,
        "ll": ll, "uncond_id": table.uncond_id, "n_tokens": table.pairs.cont_len, "n_chars": table.n_chars,
        "n_bytes": table.n_bytes, "is_greedy": greedy,
    }  # fmt: skip
    fields = {name: t(np.ascontiguousarray(columns[name][rows])) for name in REQUEST_FIELDS}
    return fields | {"uncond_uid": t(uids), "uncond_ll": t(ll[len(table) + uids])}


def one_repeat(inputs: dict[str, Any], rank: int, world: int, ours_first: bool) -> dict[str, Any]:
    """This rank's seconds (and collectives) of each sync and compute, ours and the baseline's."""
    share, metrics = inputs["share"], inputs["metrics"]
    syncing = world > 1
    ours, baseline = ICLMetric(metrics, sync_on_compute=syncing), BaselineICL(metrics)
    ours.update(**share)
    baseline.update(**share)
    out: dict[str, Any] = {}

    def ours_sync() -> None:
        with counted_collectives() as count:
            out["ours_sync_s"], _ = timed(ours.sync)
        ours.unsync()
        out["ours_collectives"] = count[0] - 1  # less timed's own barrier
        out["ours_compute_s"], out["ours_figures"] = timed(ours.compute)

    def baseline_sync() -> None:
        with counted_collectives() as count:
            out["baseline_sync_s"], _ = timed(lambda: baseline.sync(True))
        out["baseline_collectives"] = count[0] - 1
        out["baseline_compute_s"], out["baseline_figures"] = timed(lambda: baseline.compute(syncing))

    for run in (ours_sync, baseline_sync) if ours_first else (baseline_sync, ours_sync):
        run()
    nll_S, n_tokens_S, n_bytes_S = inputs["perplexity"]
    labels = len(nll_S)

    def ours_perplexity() -> list[dict[str, float]]:
        metrics = [PerplexityMetric(sync_on_compute=False) for _ in range(labels)]
        for i, metric in enumerate(metrics):
            metric.update(nll_S[i], n_tokens_S[i], n_bytes_S[i])
        return PerplexityMetric.compute_labels(metrics, None, syncing)

    def baseline_perplexities() -> list[dict[str, float]]:
        return [baseline_perplexity(nll_S[i], n_tokens_S[i], n_bytes_S[i], syncing) for i in range(labels)]

    if ours_first:
        out["ours_perplexity_s"], ppl = timed(ours_perplexity)
        out["baseline_perplexity_s"], ppl_baseline = timed(baseline_perplexities)
    else:
        out["baseline_perplexity_s"], ppl_baseline = timed(baseline_perplexities)
        out["ours_perplexity_s"], ppl = timed(ours_perplexity)
    out["perplexity_agree"] = all(
        abs(a[k] - b[k]) <= 1e-12 * abs(b[k]) for a, b in zip(ppl, ppl_baseline, strict=True) for k in b
    )
    return out


def worker(rank: int, world: int, path: str, port: int, repeats: int, out: str) -> None:
    """One gloo rank: `repeats` rounds, rank 0 writing the slowest rank's figures of each."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # the cores shared out among the ranks
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    with open(path, "rb") as f:
        table, ll, greedy, metrics, perplexity = pickle.load(f)
    mine = [torch.from_numpy(a[:, rank::world].copy()) for a in perplexity]
    inputs = {"share": rank_share(table, ll, greedy, rank, world), "metrics": metrics, "perplexity": mine}
    rounds = []
    for i in range(repeats + 1):  # the first round sets up gloo's buffers: not counted
        result = one_repeat(inputs, rank, world, ours_first=i % 2 == 0)  # the same on every rank
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, result)
        if i:
            rounds.append(gathered)
    if rank == 0:
        Path(out).write_text(json.dumps(rounds))
    dist.destroy_process_group()


def same_figures(a: dict[str, float], b: dict[str, float]) -> bool:
    """The same names and values (NaN equal to NaN)."""
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in b)


def summarize(rounds: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """The slowest rank's seconds of each round: least and median over rounds; collectives; agreement."""
    first = rounds[0][0]
    report: dict[str, Any] = {}
    for key in sorted(k for k in first if k.endswith("_s")):
        slowest = [max(rank[key] for rank in ranks) for ranks in rounds]
        report[key] = {"min": min(slowest), "median": statistics.median(slowest)}
    report["ours_collectives"] = first["ours_collectives"]
    report["baseline_collectives"] = first["baseline_collectives"]
    report["figures_agree"] = all(
        same_figures(rank["ours_figures"], rank["baseline_figures"]) and rank["perplexity_agree"]
        for ranks in rounds
        for rank in ranks
    )
    for what in ("sync", "compute", "perplexity"):
        ratio = report[f"baseline_{what}_s"]["min"] / report[f"ours_{what}_s"]["min"]
        report[f"{what}_ratio_baseline_over_ours"] = ratio
    return report


def run_world(world: int, path: str, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/out.json"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(worker, args=(world, path, port, repeats, out), nprocs=world, join=True)
        return summarize(json.loads(Path(out).read_text()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="hellaswag")
    parser.add_argument("--limit", type=int, default=None, help="documents (default: the whole split)")
    parser.add_argument("--world-sizes", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--labels", type=int, default=10, help="perplexity labels, 64 sequences each")
    parser.add_argument("--data-root", default=None, help="default: $INLOOP_EVAL_DATA or the cache")
    parser.add_argument("--output", default="bench_metric.json")
    args = parser.parse_args(argv)

    data_root = Path(args.data_root) if args.data_root else default_data_root()
    tokenizer = load_tokenizer(neox_tokenizer_path(data_root))
    metrics = get_task(args.task).metrics
    table = task_requests(args.task, tokenizer, data_root, args.limit, with_uncond=needs_uncond(metrics))
    rng = np.random.default_rng(0)
    n = len(table) + len(table.uncond)
    ll, greedy = -rng.gamma(4.0, 5.0, n), rng.random(n) < 0.1
    n_tokens = rng.integers(1, 2048, (args.labels, 64))
    perplexity = (rng.gamma(2.0, 1.5, n_tokens.shape) * n_tokens, n_tokens, n_tokens * 4)
    report: dict[str, Any] = {
        "task": args.task,
        "requests": len(table),
        "unconditional_requests": len(table.uncond),
        "documents": len(np.unique(table.doc_id)),
        "perplexity_labels": args.labels,
        "repeats": args.repeats,
        "torch_threads_per_rank": "cpu_count // world size",
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/inputs.pkl"
        with open(path, "wb") as f:
            pickle.dump((table, ll, greedy, metrics, perplexity), f)
        for world in (int(w) for w in args.world_sizes.split(",")):
            report[f"ranks_{world}"] = run_world(world, path, args.repeats)
            print(json.dumps({f"ranks_{world}": report[f"ranks_{world}"]}, indent=1), flush=True)
    Path(args.output).write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
