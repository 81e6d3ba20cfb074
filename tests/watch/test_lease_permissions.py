"""Leases across users: a watcher and a trainer running as two users. Lease files are written readable by
every user (0644, in folders 0755) whatever the watcher's umask, so the trainer sees them; and a lease file
or folder the trainer still cannot read (written private by another user) keeps its checkpoint, with a
warning naming it, in both rotation callbacks (OLMo-core's `KeepLeasedCheckpointsCallback`, torchtitan's
purge queue), instead of raising or deleting it. The trainer is another process that obeys file
permissions (`without_permission_override`), the watcher's files owned by another user where it matters."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from watch_support import without_permission_override
from workers.launch import REPO, worker_env

from inloop_eval.checkpoints.leases import Leases, lease_folder

TIMEOUT_S = 120
NOBODY = 65534

HELD = """
import json, sys
from inloop_eval.checkpoints.leases import held
print(json.dumps([held(path) for path in sys.argv[1:]]))
"""

# Both rotation callbacks asked about every checkpoint named, as a trainer's rotation asks: what each keeps,
# and what goes to removal.
ROTATE = """
import json, queue, sys
from olmo_core.train.callbacks import CheckpointerCallback
from inloop_eval.integrations.olmo_core.rotation import KeepLeasedCheckpointsCallback
from inloop_eval.integrations.torchtitan.rotation import HoldLeased

paths = sys.argv[1:]
checkpointer, keep = CheckpointerCallback(), KeepLeasedCheckpointsCallback()
class Trainer:
    callbacks = {"keep_leased": keep, "checkpointer": checkpointer}
keep.trainer = Trainer()
checkpointer._checkpoints_to_remove[:] = paths
keep.post_train_batch()
purge = queue.Queue()
holding = HoldLeased(purge)
for path in paths:
    holding.put(path)
purged = [purge.get_nowait() for _ in range(purge.qsize())]
print(json.dumps({"olmo_core_kept": keep.held, "olmo_core_removes": checkpointer._checkpoints_to_remove,
                  "torchtitan_kept": holding.kept, "torchtitan_purges": purged}))
"""


def as_another_user(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`script` in a process that obeys file permissions (a trainer that is not the watcher's user)."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        preexec_fn=without_permission_override,
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_lease_written_under_umask_077_is_read_by_a_trainer_running_as_another_user(tmp_path):
    checkpoint = tmp_path / "save" / "step10"
    checkpoint.mkdir(parents=True)
    leases = Leases("watch-a", 600)
    old = os.umask(0o077)
    try:
        leases.hold([checkpoint])
    finally:
        os.umask(old)
    folder = lease_folder(checkpoint)
    (file,) = folder.iterdir()
    assert (mode(folder.parent), mode(folder), mode(file)) == (0o755, 0o755, 0o644)
    if os.geteuid() == 0:  # the watcher's files become another user's than the trainer's
        for path in (folder.parent, folder, file):
            os.chown(path, NOBODY, NOBODY)
    done = as_another_user(HELD, str(checkpoint))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == [True], done.stderr[-3000:]
    leases.release_all()
    assert not folder.exists()


def test_a_lease_file_or_folder_the_trainer_cannot_read_keeps_its_checkpoint_in_both_rotation_callbacks(
    tmp_path,
):
    """step1's lease file mode 000, step2's lease folder mode 000, step3 leased readably, step4 not leased:
    both callbacks keep 1, 2 and 3 and hand 4 to removal; the warnings name the file and the folder, once
    each; nothing raises, and the unreadable leases are still there."""
    save = tmp_path / "save"
    paths = [save / f"step{step}" for step in (1, 2, 3, 4)]
    for path in paths:
        path.mkdir(parents=True)
    Leases("watch-a", 600).hold(paths[:3])
    (file,) = lease_folder(paths[0]).iterdir()
    folder = lease_folder(paths[1])
    file.chmod(0)
    folder.chmod(0)
    try:
        done = as_another_user(ROTATE, *map(str, paths))
    finally:
        folder.chmod(0o755)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    kept = [str(p) for p in paths[:3]]
    assert result == {
        "olmo_core_kept": kept,
        "olmo_core_removes": [str(paths[3])],
        "torchtitan_kept": kept,
        "torchtitan_purges": [str(paths[3])],
    }, done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if "cannot read the lease" in line]
    assert len(warnings) == 2, done.stderr[-3000:]
    assert str(file) in warnings[0] and "PermissionError" in warnings[0], warnings
    assert str(folder) in warnings[1] and "PermissionError" in warnings[1], warnings
    assert "Traceback" not in done.stderr
    assert file.is_file() and folder.is_dir() and all(p.is_dir() for p in paths)
