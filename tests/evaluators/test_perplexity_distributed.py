"""The `lm` evaluator in real gloo process groups of 1, 2 and 3 processes: the same figures, the same number
of forward calls on every rank, no sequence counted twice, and no hang when a label is absent from a rank's
shard or a domain fails (on every rank, or only on rank 0 while it builds the token cache)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from lm_helpers import write_domains
from workers.launch import REPO, launch, read_ranks

from inloop_eval.data.root import neox_tokenizer_path

LABELS = ("code", "prose", "tiny")
TIMEOUT_S = 150
WORKER = str(REPO / "tests" / "support" / "workers" / "lm_world_sizes.py")


def run_world(world_size: int, workdir: Path, tokenizer_path: str) -> list[dict]:
    """Every rank's results from one launch of `world_size` processes (tests/support/workers/lm_world_sizes.py),
    on a token cache of its own; a failure or a hang fails the test."""
    out = workdir / f"ws{world_size}"
    out.mkdir()
    args = [WORKER, "--data", str(workdir / "data"), "--cache", str(workdir / f"cache-{world_size}")]
    launch(world_size, [*args, "--tokenizer", tokenizer_path, "--out", str(out)], timeout=TIMEOUT_S)
    return read_ranks(out, world_size)


def test_world_sizes_give_the_same_figures(tmp_path, neox_tokenizer, data_root):
    write_domains(tmp_path / "data", neox_tokenizer, n_tiny=1)
    (tmp_path / "data" / "broken.jsonl").write_text('{"text": "fine"}\n{"text": not json}\n')
    tokenizer_path = str(neox_tokenizer_path(data_root))
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
