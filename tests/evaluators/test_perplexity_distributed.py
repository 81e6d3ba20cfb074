"""The `lm` evaluator in real gloo process groups of 1, 2 and 3 processes: the same figures, the same number
of forward calls on every rank, no sequence counted twice, and no hang when a label is absent from a rank's
shard or a domain fails (on every rank, or only on rank 0 while it builds the token cache)."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from lm_helpers import join_or_fail, lm_entry, tiny_gpt, write_domains

from inloop_eval.data.root import neox_tokenizer_path

LABELS = ("code", "prose", "tiny")
TIMEOUT_S = 150


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world_size: int, port: int, workdir: str, tokenizer_path: str) -> None:
    """One rank: a clean evaluation, then two that fail (a model too small for the tokens; a JSONL file
    that only rank 0 reads, while building the cache). Writes what it saw to out-<world>-<rank>.json."""
    import torch
    import torch.distributed as dist

    from inloop_eval.data.tokenizer import load_tokenizer
    from inloop_eval.evaluators.config import EvaluatorConfig
    from inloop_eval.evaluators.orchestrator import InLoopEvaluator

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
    )
    try:
        root = Path(workdir)
        tokenizer = load_tokenizer(tokenizer_path)
        files = {
            "code": root / "data" / "code",
            "prose": root / "data" / "prose.jsonl",
            "tiny": root / "data" / "tiny.npy",
        }
        cache = root / f"cache-{world_size}"
        model = tiny_gpt()
        calls = [0]
        hidden_states = model.hidden_states

        def counted(*args, **kwargs):
            calls[0] += 1
            return hidden_states(*args, **kwargs)

        model.hidden_states = counted
        evaluator = InLoopEvaluator(
            EvaluatorConfig(evaluators=[lm_entry(files, cache)], strict=True), tokenizer=tokenizer
        )
        metrics = evaluator.run(model)
        result = evaluator.detail("lm:" + ",".join(LABELS))
        shard = {label: int((result.shard.domain_S == d).sum()) for d, label in enumerate(LABELS)}

        lenient = EvaluatorConfig(evaluators=[lm_entry(files, cache)], strict=False)
        too_small = InLoopEvaluator(lenient, tokenizer=tokenizer).run(tiny_gpt(vocab_size=1000))
        broken = {**files, "prose": root / "data" / "broken.jsonl"}
        lenient = EvaluatorConfig(evaluators=[lm_entry(broken, cache)], strict=False)
        rank0_fails = InLoopEvaluator(lenient, tokenizer=tokenizer).run(model)
        out = {
            "metrics": metrics,
            "calls": calls[0],
            "shard": shard,
            "too_small": too_small,
            "rank0_fails": rank0_fails,
        }
        (root / f"out-{world_size}-{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


def run_world(world_size: int, workdir: Path, tokenizer_path: str) -> list[dict]:
    """Start `world_size` gloo processes and wait for them; a failure or a hang fails the test.

    The processes fork from a fresh server process that has imported the package once (`forkserver`), so
    each starts in well under a second instead of importing torch and torchmetrics again."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(["inloop_eval", "lm_helpers", __name__])
    ctx = mp.start_processes(
        _worker,
        args=(world_size, free_port(), str(workdir), tokenizer_path),
        nprocs=world_size,
        join=False,
        start_method="forkserver",
    )
    join_or_fail(ctx, TIMEOUT_S, f"world size {world_size}: the processes")
    return [json.loads((workdir / f"out-{world_size}-{r}.json").read_text()) for r in range(world_size)]


def test_world_sizes_give_the_same_figures(tmp_path, neox_tokenizer, data_root):
    write_domains(tmp_path / "data", neox_tokenizer, n_tiny=1)
    (tmp_path / "data" / "broken.jsonl").write_text('{"text": "fine"}\n{"text": not json}\n')
    tokenizer_path = str(neox_tokenizer_path(data_root))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = {}
    for w in (1, 2, 3):
        t0 = time.monotonic()
        results[w] = run_world(w, tmp_path, tokenizer_path)
        print(f"world {w}: {time.monotonic() - t0:.1f}s")

    base = results[1][0]
    keys = {f"eval/lm/{label}/{k}" for label in LABELS for k in ("ce", "ppl", "bpb")}
    assert set(base["metrics"]) == keys
    worst = 0.0
    for world_size, ranks in results.items():
        assert len({r["calls"] for r in ranks}) == 1, f"world {world_size}: unequal forward calls"
        for label in LABELS:  # every sequence on exactly one rank
            assert sum(r["shard"][label] for r in ranks) == base["shard"][label]
        for r in ranks:
            assert set(r["metrics"]) == keys
            for key, value in r["metrics"].items():
                assert math.isfinite(value)
                assert value == pytest.approx(base["metrics"][key], rel=1e-6), (world_size, key)
                worst = max(worst, abs(value - base["metrics"][key]) / abs(base["metrics"][key]))
            assert r["too_small"] == {f"eval/lm/{label}/failed": 1.0 for label in LABELS}
            assert r["rank0_fails"]["eval/lm/prose/failed"] == 1.0
            assert set(r["rank0_fails"]) == {"eval/lm/prose/failed"} | {
                f"eval/lm/{label}/{k}" for label in ("code", "tiny") for k in ("ce", "ppl", "bpb")
            }
            for label in ("code", "tiny"):
                assert r["rank0_fails"][f"eval/lm/{label}/ce"] == pytest.approx(
                    base["metrics"][f"eval/lm/{label}/ce"], rel=1e-6
                )
    assert any(r["shard"]["tiny"] == 0 for r in results[3])  # the label some ranks never saw
    print(f"largest relative difference from world size 1: {worst:.2e}")
