"""The watcher triggered by the trainer and holding checkpoints until they are scored, beside a real OLMo-core
`Trainer` on CPU: OLMo-core's `CheckpointReadyNotifierCallback` (and a second event per checkpoint through
`write_ready_event`) drives `inloop-eval watch --events` with the folder scan slowed to minutes, and
`KeepLeasedCheckpointsCallback` keeps the checkpoints the watcher leases from `max_checkpoints=1` rotation;
then a watcher killed with SIGKILL, whose leases expire. The watcher is made slower than training, whatever
the machine's load, by a model builder that waits for a gate file (`watch_builders`)."""

from __future__ import annotations

import json
import queue
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from olmo_core.train.callbacks import Callback, CheckpointerCallback, CheckpointReadyNotifierCallback
from watch_support import eval_lines, olmo_eval_yaml, train_olmo_core, wait_for
from workers.launch import REPO, worker_env

from inloop_eval.checkpoints.leases import LEASE_DIR, held, leases_on
from inloop_eval.errors import ConfigError
from inloop_eval.integrations.olmo_core.rotation import KeepLeasedCheckpointsCallback
from inloop_eval.watch.events import Inbox, event_file, read_event, write_ready_event
from inloop_eval.watch.ledger import LEDGER_FILE, WATCH_DIR, read_jsonl

STEPS = 3
SAVED = [0, 1, 2, 3]  # a checkpoint after every step, and the starting weights
TIMEOUT_S = 300


def watch_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "inloop_eval.cli", "watch", *args]


def ledger(run_dir: Path) -> list[dict]:
    path = run_dir / WATCH_DIR / LEDGER_FILE
    return read_jsonl(path) if path.is_file() else []


def evaluated(run_dir: Path) -> set[int]:
    return {e["step"] for e in ledger(run_dir) if e["status"] == "evaluated"}


@dataclass
class Pacer(Callback):
    """The test's view of training (runs before the rotation callback and the checkpointer): at each step it
    waits until the previous checkpoint is held by the watcher (or evaluated), so that every checkpoint is
    leased before rotation could pick it, whatever the machine's load; at the last step it opens the gate
    that held the watcher's first read back (so the watcher is slower than training), and waits until the
    watcher has evaluated all but the last two and released their leases, so that rotation frees them while
    training still runs. It
    writes a second ready event for each checkpoint (a duplicate to the watcher), and records into `record`
    each checkpoint OLMo-core removes, with whether the watcher had evaluated it then, and how many
    checkpoints the rotation callback held at most."""

    priority: ClassVar[int] = KeepLeasedCheckpointsCallback.priority + 1
    run_dir: str = ""
    inbox: str = ""
    record: str = ""
    gate: str = ""

    def pre_train(self) -> None:
        self.removed: list[tuple[int, bool]] = []
        self.most_held = 0
        checkpointer = next(c for c in self.trainer.callbacks.values() if isinstance(c, CheckpointerCallback))
        remove = checkpointer._remove_checkpoint

        def recorded(path: str) -> None:
            step = int(Path(path).name.removeprefix("step"))
            self.removed.append((step, step in evaluated(Path(self.run_dir))))
            remove(path)

        checkpointer._remove_checkpoint = recorded

    def post_checkpoint_saved(self, path) -> None:
        step = int(Path(path).name.removeprefix("step"))
        write_ready_event(self.inbox, step=step, checkpoint_path=path, run_id="second-notifier")

    def post_train_batch(self) -> None:
        save, run_dir = Path(self.trainer.save_folder), Path(self.run_dir)
        previous = self.step - 1
        wait_for(
            lambda: held(save / f"step{previous}") or previous in evaluated(run_dir),
            TIMEOUT_S,
            f"the watcher holding step {previous}",
        )
        if self.step == STEPS:
            Path(self.gate).touch()
            freed = [save / f"step{step}" for step in range(STEPS - 1)]
            wait_for(
                lambda: set(range(STEPS - 1)) <= evaluated(run_dir) and not any(held(p) for p in freed),
                TIMEOUT_S,
                "the watcher's evaluations and releases",
            )
        keeper = next(
            c for c in self.trainer.callbacks.values() if isinstance(c, KeepLeasedCheckpointsCallback)
        )
        self.most_held = max(self.most_held, len(keeper.held))

    def post_train(self) -> None:
        Path(self.record).write_text(json.dumps({"removed": self.removed, "most_held": self.most_held}))


@pytest.fixture(scope="module")
def triggered(data_root, tmp_path_factory):
    """`inloop-eval watch --events INBOX --poll 600 --lease 60` started before training; the trainer saves
    after every step with `max_checkpoints=1`, OLMo-core's notifier and the rotation callback."""
    work = tmp_path_factory.mktemp("triggered")
    config = olmo_eval_yaml(data_root, work / "eval.yaml")
    run_dir, inbox, record = work / "sidecar", work / "inbox", work / "record.json"
    args = [
        str(work / "save"),
        "--config",
        str(config),
        "--run-dir",
        str(run_dir),
        "--data-root",
        str(data_root),
    ]
    args += ["--events", str(inbox), "--events-poll", "0.2", "--poll", "600", "--lease", "60"]
    args += ["--until-step", str(STEPS), "--model-builder", "watch_builders:olmo_core_model_after_gate"]
    watcher = subprocess.Popen(
        watch_command(*args),
        cwd=REPO,
        env={**worker_env(), "WATCH_TEST_GATE": str(work / "gate")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(lambda: (run_dir / WATCH_DIR / LEDGER_FILE).is_file(), TIMEOUT_S, "the watcher starting")
        callbacks = {
            "notifier": CheckpointReadyNotifierCallback(
                inbox_dir=str(inbox), run_id="tiny-run", lineage_id="tiny-lineage"
            ),
            "keep_leased": KeepLeasedCheckpointsCallback(),
            "pacer": Pacer(
                run_dir=str(run_dir), inbox=str(inbox), record=str(record), gate=str(work / "gate")
            ),
        }
        train_olmo_core(
            work,
            data_root,
            steps=STEPS,
            save_interval=1,
            in_loop=False,
            callbacks=callbacks,
            max_checkpoints=1,
        )
        out, _ = watcher.communicate(timeout=TIMEOUT_S)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    assert watcher.returncode == 0, out[-5000:]
    return {
        "work": work,
        "run_dir": run_dir,
        "inbox": inbox,
        "config": config,
        **json.loads(record.read_text()),
    }


def test_each_announced_checkpoint_is_evaluated_once_on_its_event_with_the_scan_slowed_to_minutes(triggered):
    """Two events per checkpoint (OLMo-core's and a duplicate): each step evaluated once. The folder was
    scanned once, at the start, before any checkpoint (the next scan was 600 s away and the watcher ended
    long before): every evaluation was started by an event, which the ledger records with its run and
    lineage."""
    run_dir, inbox = triggered["run_dir"], triggered["inbox"]
    assert sorted(line["step"] for line in eval_lines(run_dir)) == SAVED
    started = [e for e in ledger(run_dir) if e["status"] == "started"]
    assert sorted(e["step"] for e in started) == SAVED
    for entry in started:
        assert Path(entry["event"]).name.endswith(".ready.json"), entry
        assert entry["run_id"] in ("tiny-run", "second-notifier"), entry
    by_olmo = [read_event(event_file(inbox, "tiny-run", step)) for step in SAVED]
    assert [(e.step, e.lineage_id) for e in by_olmo] == [(s, "tiny-lineage") for s in SAVED]
    assert all(event_file(inbox, "second-notifier", step).is_file() for step in SAVED)


def test_rotation_removes_no_checkpoint_before_the_watcher_evaluated_it_and_frees_each_once_it_has(triggered):
    """max_checkpoints=1 would remove each checkpoint two steps after it was saved; the watcher, slower,
    held them: none removed before its evaluation, none lost (nothing `vanished`), and the ones evaluated
    while training ran were removed then. What is left is what OLMo-core alone leaves: the last two."""
    run_dir, save = triggered["run_dir"], triggered["work"] / "save"
    assert triggered["most_held"] >= 1
    assert [step for step, _ in triggered["removed"]] == list(range(STEPS - 1))
    assert all(was_evaluated for _, was_evaluated in triggered["removed"])
    assert not [e for e in ledger(run_dir) if e["status"] == "vanished"]
    assert sorted(p.name for p in save.iterdir() if p.name.startswith("step")) == [
        f"step{STEPS - 1}",
        f"step{STEPS}",
    ]
    # The watcher released its leases as it evaluated, and exited holding none.
    assert not any(held(save / f"step{step}") for step in SAVED)
    assert not [p for p in (save / LEASE_DIR).rglob("*") if p.is_file()]


def test_a_watcher_killed_with_sigkill_lets_its_leases_expire(triggered, tmp_path):
    """Killed mid-read, the watcher leaves its leases on the checkpoints it had not evaluated: they hold
    them until `--lease` seconds after their last refresh, then no longer (the files stay, expired), and the
    rotation helper hands them back."""
    folder = tmp_path / "save"
    for step in (STEPS - 1, STEPS):
        shutil.copytree(triggered["work"] / "save" / f"step{step}", folder / f"step{step}")
    run_dir = tmp_path / "run"
    args = [str(folder), "--config", str(triggered["config"]), "--run-dir", str(run_dir), "--settle", "0"]
    args += ["--once", "--lease", "8", "--model-builder", "watch_builders:olmo_core_model_after_gate"]
    watcher = subprocess.Popen(
        watch_command(*args),
        cwd=REPO,
        env={**worker_env(), "WATCH_TEST_GATE": str(tmp_path / "never")},  # its first read never ends
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    later = folder / f"step{STEPS}"
    try:
        wait_for(
            lambda: STEPS - 1 in {e["step"] for e in ledger(run_dir) if e["status"] == "started"},
            TIMEOUT_S,
            "a read",
        )
        wait_for(lambda: held(later), TIMEOUT_S, "the lease on the later checkpoint")
    finally:
        watcher.send_signal(signal.SIGKILL)
        watcher.wait()
    (lease,) = leases_on(later)
    assert lease.checkpoint == later.name and lease.expires_at - lease.written_at == 8
    wait_for(lambda: not held(later), 60, "the lease expiring")
    assert leases_on(later) == [lease]  # expired, not released: nobody was alive to release it


def test_the_rotation_callback_must_run_before_the_checkpointer():
    """A priority changed under the checkpointer's would let a leased checkpoint be removed: refused."""

    class Late(KeepLeasedCheckpointsCallback):
        priority = 0

    class Trainer:
        callbacks = {"checkpointer": CheckpointerCallback(), "keep_leased": Late()}

    late = Trainer.callbacks["keep_leased"]
    late.trainer = Trainer()
    with pytest.raises(ConfigError, match="must run before the CheckpointerCallback"):
        late.pre_train()


def test_torchtitans_purge_passes_on_what_no_lease_holds(tmp_path):
    """`HoldLeased`, torchtitan's purge queue during a purge: a held checkpoint kept, the others queued."""
    from inloop_eval.checkpoints.leases import Leases
    from inloop_eval.integrations.torchtitan.rotation import HoldLeased, KeepLeasedCheckpointManager

    kept, free = tmp_path / "step-10", tmp_path / "step-20"
    kept.mkdir(), free.mkdir()
    Leases("watch-test", 60).hold([kept])
    purge: queue.Queue[str | None] = queue.Queue()
    holding = HoldLeased(purge)
    holding.put(str(kept))
    holding.put(str(free))
    assert holding.kept == [str(kept)]
    assert purge.get_nowait() == str(free) and purge.empty()
    assert KeepLeasedCheckpointManager.Config(enable=True)._owner is KeepLeasedCheckpointManager


def test_an_inbox_reads_each_event_once_and_leaves_files_that_are_not_events(tmp_path):
    inbox = Inbox(tmp_path)
    first = write_ready_event(tmp_path, step=5, checkpoint_path=tmp_path / "step5", run_id="run")
    assert write_ready_event(tmp_path, step=5, checkpoint_path=tmp_path / "step5", run_id="run") == first
    (tmp_path / "run" / "step-7.ready.json").write_text('{"event": "something_else"}')
    (tmp_path / "run" / ".step-8.ready.json.tmp").write_text("{")
    (event,) = inbox.take()
    assert (event.step, event.run_id, event.lineage_id) == (5, "run", "run")
    assert inbox.take() == []
    with pytest.raises(Exception, match="must match"):
        write_ready_event(tmp_path, step=1, checkpoint_path=tmp_path, run_id="../up")


def test_an_event_for_a_checkpoint_outside_the_watched_folder_or_of_another_step_announces_nothing(tmp_path):
    from inloop_eval.watch.events import ReadyEvent, announced_checkpoint

    def event(step: int, path: Path) -> ReadyEvent:
        return ReadyEvent(step=step, checkpoint_path=path, run_id="r", lineage_id="r", file=tmp_path / "e")

    folder = tmp_path / "save"
    found = announced_checkpoint(event(4, folder / "step4"), folder)
    assert found is not None and (found.step, found.format) == (4, "olmo_core")
    assert announced_checkpoint(event(4, tmp_path / "other" / "step4"), folder) is None
    assert announced_checkpoint(event(5, folder / "step4"), folder) is None


def test_a_lease_holds_until_it_expires_is_refreshed_while_held_and_released_when_no_longer_wanted(tmp_path):
    from inloop_eval.checkpoints.leases import Leases

    one, two = tmp_path / "step1", tmp_path / "step2"
    leases = Leases("watch-a", 30)
    leases.hold([one, two], now=1000)
    assert held(one, now=1029) and not held(one, now=1030)
    leases.hold([one, two], now=1005)  # under a third of the expiry old: not rewritten
    assert not held(one, now=1030)
    leases.hold([one], now=1010)  # rewritten; two no longer wanted: released
    assert held(one, now=1039) and not held(two, now=1010) and not (tmp_path / LEASE_DIR / "step2").exists()
    Leases("watch-b", 100).hold([one], now=1000)  # another watcher's lease holds it too
    leases.release_all()
    assert held(one, now=1050) and [lease.holder for lease in leases_on(one)] == ["watch-b"]


def test_trainers_read_leases_and_write_events_without_importing_torch():
    code = "import sys, inloop_eval.checkpoints.leases, inloop_eval.watch.events; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, env=worker_env()).returncode == 0
