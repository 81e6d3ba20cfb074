"""What a shared inbox may hold that is not an event never hangs or stops the watcher: a FIFO named like an
event (never waited on), an event file of 200,000 nested brackets (JSON too deep to parse), a file larger
than an event can be, and a folder of another run this user cannot list. Each is named in a warning once and
left, and the events beside it are read. And an event written before its checkpoint's folder is renamed into
place is acted on once the folder appears, not at the next scan. Every reader runs in a process of its own
under a timeout, so a hang fails the test instead of stopping the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from watch_support import (
    eval_lines,
    single_file_checkpoints,
    wait_for,
    watch_cli,
    without_permission_override,
)
from workers.launch import REPO, worker_env

from inloop_eval.watch.events import MAX_EVENT_BYTES, event_file, write_ready_event

TIMEOUT_S = 60
# Two looks at the inbox: each event read once, each bad file named once.
TAKE = """
import json, logging, sys
from pathlib import Path
from inloop_eval.watch.events import Inbox
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
inbox = Inbox(Path(sys.argv[1]))
print(json.dumps([event.step for event in inbox.take() + inbox.take()]))
"""


def take_in_a_process(inbox: Path, *, obey_permissions: bool = False) -> tuple[list[int], str]:
    """The steps `Inbox(inbox)` reads in two looks, in another process (bounded in time), and its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", TAKE, str(inbox)],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        preexec_fn=without_permission_override if obey_permissions else None,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr


def fifo(inbox: Path) -> Path:
    path = event_file(inbox, "run", 4)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def deeply_nested(inbox: Path) -> Path:
    path = event_file(inbox, "run", 5)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[" * 200_000 + "]" * 200_000)
    return path


def too_large(inbox: Path) -> Path:
    path = event_file(inbox, "run", 6)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"event": "checkpoint_ready", "padding": "' + "x" * MAX_EVENT_BYTES + '"}')
    return path


def unlistable(inbox: Path) -> Path:
    folder = inbox / "another-run"
    write_ready_event(inbox, step=7, checkpoint_path=inbox / "elsewhere" / "step7", run_id="another-run")
    folder.chmod(0)
    return folder


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (fifo, "not a regular file (a FIFO)"),
        (deeply_nested, "JSON nested too deeply to parse"),
        (too_large, f"larger than {MAX_EVENT_BYTES} bytes"),
        (unlistable, "cannot list"),
    ],
)
def test_what_is_not_an_event_is_named_once_and_left_and_the_events_beside_it_are_read(make, says, tmp_path):
    inbox = tmp_path / "inbox"
    write_ready_event(inbox, step=2, checkpoint_path=tmp_path / "save" / "step2", run_id="run")
    bad = make(inbox)
    try:
        steps, err = take_in_a_process(inbox, obey_permissions=True)
    finally:
        if bad.is_dir():
            bad.chmod(0o755)
    assert steps == [2], err
    warnings = [line for line in err.splitlines() if line.startswith("WARNING") and str(bad) in line]
    assert len(warnings) == 1 and says in warnings[0], err
    assert "Traceback" not in err


def test_inloop_eval_watch_reads_its_event_beside_a_fifo_a_deep_file_and_an_unlistable_folder(
    data_root, tmp_path
):
    """The whole command, its leases on (their keeper reads the inbox too, in its thread): each bad entry
    named in a warning, the announced checkpoint evaluated, exit 0."""
    folder = single_file_checkpoints(tmp_path / "save", data_root, [10])
    inbox = tmp_path / "inbox"
    write_ready_event(inbox, step=10, checkpoint_path=folder / "checkpoint-10", run_id="run")
    bad = [fifo(inbox), deeply_nested(inbox), unlistable(inbox)]
    config = tmp_path / "eval.yaml"
    evaluators = [{"task": "piqa", "limit": 3}]
    config.write_text(yaml.safe_dump({"evaluators": evaluators, "data_root": str(data_root), "max_length": 128}))
    run_dir = tmp_path / "run"
    args = [str(folder), "--config", str(config), "--run-dir", str(run_dir), "--once", "--settle", "0"]
    try:
        done = watch_cli(*args, "--events", str(inbox), "--lease", "60", obey_permissions=True, timeout=240)
    finally:
        bad[-1].chmod(0o755)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    for path in bad:
        assert str(path) in done.stderr, (path, done.stderr[-3000:])
    assert [line["step"] for line in eval_lines(run_dir)] == [10]


def test_an_event_written_before_its_folder_is_renamed_into_place_is_acted_on_when_it_appears(data_root, tmp_path):
    """`inloop-eval watch --events` with the scan slowed to 10 minutes: step 20's event is read while its
    folder is not there yet; the folder renamed into place a second later is evaluated at the next look at
    the inbox, and the watcher exits at --until-step 20."""
    folder = single_file_checkpoints(tmp_path / "save", data_root, [10])
    staged = single_file_checkpoints(tmp_path / "staging", data_root, [20]) / "checkpoint-20"
    inbox, run_dir, config = tmp_path / "inbox", tmp_path / "run", tmp_path / "eval.yaml"
    evaluators = [{"task": "piqa", "limit": 3}]
    config.write_text(yaml.safe_dump({"evaluators": evaluators, "data_root": str(data_root), "max_length": 128}))
    args = [str(folder), "--config", str(config), "--run-dir", str(run_dir), "--events", str(inbox)]
    args += ["--events-poll", "0.2", "--poll", "600", "--settle", "0", "--until-step", "20"]
    watcher = subprocess.Popen(
        [sys.executable, "-m", "inloop_eval.cli", "watch", *args],
        cwd=REPO,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: [line["step"] for line in eval_lines(run_dir)] == [10], 180, "step 10 evaluated")
        write_ready_event(inbox, step=20, checkpoint_path=folder / "checkpoint-20", run_id="run")
        time.sleep(1)  # several looks at the inbox find the event, and no folder
        staged.rename(folder / "checkpoint-20")
        out, _ = watcher.communicate(timeout=120)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    assert watcher.returncode == 0, out[-3000:]
    assert [line["step"] for line in eval_lines(run_dir)] == [10, 20]
