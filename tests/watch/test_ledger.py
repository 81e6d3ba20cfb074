"""What a restarted watcher reads back from its run directory: a step is done once its `metrics.jsonl`
line is there (the commit), whoever wrote it; a `started` step without that line is evaluated again."""

from __future__ import annotations

import json
from pathlib import Path

from inloop_eval.checkpoints.formats import Checkpoint
from inloop_eval.watch.discovery import discover, one_per_step, parse_name
from inloop_eval.watch.ledger import (
    EVALUATED,
    FAILED,
    LEDGER_FILE,
    SKIPPED,
    STARTED,
    WATCH_DIR,
    Ledger,
    read_jsonl,
)


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
        ledger.record(STARTED, 7)  # its metrics line never written (a full disk), or cleaned away since
        ledger.record(EVALUATED, 7)
        history = ledger.history()
    finally:
        ledger.close()
    assert history.by_watcher == {1, 2}
    assert history.in_loop == {4}
    assert history.skipped == {5}
    assert [s for s in range(1, 8) if not history.done(s, redo_in_loop=False)] == [3, 6, 7]
    assert [s for s in range(1, 8) if not history.done(s, redo_in_loop=True)] == [3, 4, 6, 7]


def test_a_checkpoint_the_config_could_not_take_stays_failed_under_that_config_only(tmp_path):
    ledger = Ledger(tmp_path)
    try:
        ledger.record(
            FAILED, 10, reason="max_length 128 is longer than the 32 positions", retry=False, config="a"
        )
        ledger.record(FAILED, 20, reason="PermissionError", retry=True)
        assert ledger.history("a").refused == {10}
        assert not ledger.history("a").done(20, redo_in_loop=False)  # tried again
        assert ledger.history("b").refused == set()
    finally:
        ledger.close()


def test_a_cut_off_last_ledger_line_does_not_swallow_the_next_entry(tmp_path):
    path = tmp_path / WATCH_DIR / LEDGER_FILE
    path.parent.mkdir()
    path.write_text('{"status": "started", "step": 1}\n{"status": "evaluated", "st')  # killed mid-write
    ledger = Ledger(tmp_path)
    try:
        ledger.record(STARTED, 2)
        ledger.record(EVALUATED, 2)
    finally:
        ledger.close()
    assert [(e["step"], e["status"]) for e in read_jsonl(path)] == [
        (1, "started"),
        (2, "started"),
        (2, "evaluated"),
    ]


def test_folder_names_give_the_format_and_step(tmp_path):
    assert parse_name("checkpoint-500") == (500, "hf")
    assert parse_name("step1000") == (1000, "olmo_core")
    assert parse_name("step-1000") == (1000, "torchtitan")
    for name in ("step1000-tmp", "checkpoint-best", "step", "latest"):
        assert parse_name(name) is None
    for name in ("step20", "step3", "step3-tmp"):
        (tmp_path / name).mkdir()
    assert [c.step for c in discover(tmp_path)] == [3, 20]


def test_of_two_folders_naming_one_step_the_one_without_leading_zeros_is_kept(tmp_path):
    for name in ("checkpoint-0010", "checkpoint-10", "checkpoint-00020", "checkpoint-020", "checkpoint-30"):
        (tmp_path / name).mkdir()
    kept, groups = one_per_step(discover(tmp_path))
    assert [c.path.name for c in kept] == ["checkpoint-10", "checkpoint-00020", "checkpoint-30"]
    assert [[c.path.name for c in g] for g in groups] == [
        ["checkpoint-10", "checkpoint-0010"],
        ["checkpoint-00020", "checkpoint-020"],
    ]
