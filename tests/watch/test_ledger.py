"""What a restarted watcher reads back from its run directory: a step is done once its `metrics.jsonl`
line is there (the commit), whoever wrote it; a `started` step without that line is evaluated again."""

from __future__ import annotations

import json
from pathlib import Path

from inloop_eval.watch.discovery import Checkpoint, discover, parse_name
from inloop_eval.watch.ledger import EVALUATED, SKIPPED, STARTED, Ledger


def metrics_line(run_dir: Path, step: int) -> None:
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": step, "eval/downstream/piqa/acc": 0.5}) + "\n")


def test_the_commit_is_the_metrics_line(tmp_path):
    ledger = Ledger(tmp_path)
    try:
        ckpt = {
            s: Checkpoint(step=s, path=tmp_path / f"step{s}", format="olmo_core") for s in (1, 2, 3, 4, 5)
        }
        ledger.record(STARTED, ckpt[1])
        ledger.record(EVALUATED, ckpt[1])
        metrics_line(tmp_path, 1)
        ledger.record(STARTED, ckpt[2])  # killed after its metrics line, before `evaluated`
        metrics_line(tmp_path, 2)
        ledger.record(STARTED, ckpt[3])  # killed mid-evaluation: no metrics line
        metrics_line(tmp_path, 4)  # the training loop's line: no `started`
        ledger.record(SKIPPED, ckpt[5], reason="policy latest")
        with (tmp_path / "metrics.jsonl").open("a") as f:
            f.write('{"step": 6, "eval/downstream/pi')  # a line cut off by a killed writer: not a commit
        history = ledger.history()
    finally:
        ledger.close()
    assert history.by_watcher == {1, 2}
    assert history.in_loop == {4}
    assert history.skipped == {5}
    assert [s for s in range(1, 7) if not history.done(s, redo_in_loop=False)] == [3, 6]
    assert [s for s in range(1, 7) if not history.done(s, redo_in_loop=True)] == [3, 4, 6]


def test_folder_names_give_the_format_and_step(tmp_path):
    assert parse_name("checkpoint-500") == (500, "hf")
    assert parse_name("step1000") == (1000, "olmo_core")
    assert parse_name("step-1000") == (1000, "torchtitan")
    for name in ("step1000-tmp", "checkpoint-best", "step", "latest"):
        assert parse_name(name) is None
    for name in ("step20", "step3", "step3-tmp"):
        (tmp_path / name).mkdir()
    assert [c.step for c in discover(tmp_path)] == [3, 20]
