"""`JSONLLogger`: the run directory's `metrics.jsonl` (one JSON line per call) and `config.json`, appended to
and never rewritten; what `inloop-eval report RUN_DIR` reads.

Several writers may share one `metrics.jsonl` (a restarted job beside a stale one, two launches on one run
directory), on a disk that may fill. What each writer promises the others:
- a line is appended whole or not at all: one `os.write` of the whole line on a descriptor opened with
  `O_APPEND`, under an exclusive `flock` of the file (waited for at most `LOCK_WAIT_S`), so lines never
  interleave and a line starts after a newline (a line cut off by a killed writer is ended first);
- a write that fails partway (a full disk, a file size limit) removes its own bytes, and only when it holds
  the lock and they are still the file's last bytes; it never truncates what another writer wrote. A part it
  cannot remove stays as one unreadable line, which readers skip and the next line starts after;
- values are strict JSON: a figure that is not a finite number (NaN, infinity) is written as `null`.
Without the lock (no `fcntl`, a file system without `flock`, a holder that does not let go) lines are still
appended whole in one write each, and a failed write's part is left in place rather than cut out.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inloop_eval.data.files import write_text_atomically
from inloop_eval.loggers.base import LoggerError, MetricsLogger, WarnOnce, as_dict, error_kind, is_rank_zero
from inloop_eval.loggers.outcomes import OUTCOMES_DIR, OutcomesWriter
from inloop_eval.metrics.icl import DocumentOutcomes

try:
    import fcntl
except ImportError:  # not POSIX: no lock (see the module docstring)
    fcntl = None  # type: ignore[assignment]

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
# The longest a write waits for another writer's lock: a holder is done in microseconds, unless it is stopped.
LOCK_WAIT_S = 1.0


def lock(fd: int) -> bool:
    """Take an exclusive `flock` on the file open as `fd`, waiting at most LOCK_WAIT_S; False when not held."""
    if fcntl is None:
        return False
    deadline = time.monotonic() + LOCK_WAIT_S
    delay = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(2 * delay, 0.05)
        except OSError:  # a file system without flock (ENOLCK, EINVAL)
            return False


def unlock(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
        pass  # closing the file releases it


def ends_a_line(fd: int, size: int) -> bool:
    """Whether the file open as `fd`, `size` bytes long, is empty or ends with a newline; False when it cannot
    be read (a newline too many is a blank line, which readers ignore)."""
    if size == 0:
        return True
    try:
        return os.pread(fd, 1, size - 1) == b"\n"
    except OSError:
        return False


def remove_own_part(fd: int, start: int, written: int) -> bool:
    """Cut off the `written` bytes a failed write appended at `start`, if they are still the file's last
    bytes; False when they stay. Called only under the lock: no other writer can append meanwhile."""
    try:
        if os.fstat(fd).st_size != start + written:
            return False  # a writer that ignores the lock appended after them: keep its bytes
        os.ftruncate(fd, start)
        return True
    except OSError:
        return False


class JSONLLogger(MetricsLogger):
    """`<run_dir>/metrics.jsonl`, one line `{"step": step, key: value, ...}` per call, written at once;
    `<run_dir>/config.json` for the config. What `inloop-eval report RUN_DIR` reads.

    The file is opened for appending and never rewritten: a resumed job adds to what was logged before. A
    step logged again (a job resumed from an earlier checkpoint re-runs steps) is appended too, with a
    warning; readers keep the last value of each (step, key). A write that fails (a full disk) removes
    the part of its line it wrote (under the lock; see the module docstring), is warned about once per kind
    of error, and is skipped. NaN and infinite values are written as `null`, warned about once.
    Per-document outcomes (`log_outcomes`) go to `<run_dir>/outcomes/step_<N>.npz` (`loggers.outcomes`).

    run_dir: created if missing.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._fd: int | None = None
        self._warn = WarnOnce()
        self.outcomes = OutcomesWriter(self.run_dir / OUTCOMES_DIR)
        # (key -> steps) already in the file, to notice a step logged twice.
        self._logged: dict[str, set[int]] = {}
        if not is_rank_zero():
            return
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            # Read as well as written: a line starts after a newline, and only the file's last byte says so.
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as exc:
            raise LoggerError(
                f"JSONLLogger: cannot open {self.path} for appending ({exc}); pass a run_dir that can be "
                "created and written"
            ) from exc
        self._read_existing()

    @property
    def path(self) -> Path:
        return self.run_dir / METRICS_FILE

    def _read_existing(self) -> None:
        """Note the (step, key) pairs an earlier job logged. Older files hold bare NaN where a figure was not
        finite; `json.loads` reads it."""
        try:
            data = self.path.read_bytes() if self.path.is_file() else b""
        except OSError as exc:
            self._warn(
                "read", f"JSONLLogger: cannot read {self.path} ({exc}); steps logged twice go unnoticed"
            )
            return
        for line in data.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a cut-off line: the report skips it and says so
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                for key in row.keys() - {"step"}:
                    self._logged.setdefault(key, set()).add(row["step"])

    def log_config(self, config: Any) -> None:
        if self._fd is None:
            return
        path = self.run_dir / CONFIG_FILE
        try:
            text = json.dumps(as_dict(config), indent=2, sort_keys=True, default=str)
            write_text_atomically(path, text)
        except (OSError, TypeError, ValueError) as exc:
            self._warn(
                f"config:{error_kind(exc)}",
                f"JSONLLogger: config not written to {path} ({type(exc).__name__}: {exc}); training goes on",
            )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self._fd is None:
            return
        row = self._row(metrics, step)
        if row is None:
            return
        line = json.dumps(row, allow_nan=False) + "\n"
        if self._write(self._fd, line, row["step"]):
            self._note_steps(row)

    def log_outcomes(self, outcomes: Mapping[str, DocumentOutcomes], step: int) -> None:
        if self._fd is not None:
            self.outcomes.write(outcomes, step)

    def _row(self, metrics: Mapping[str, float], step: int) -> dict[str, Any] | None:
        """The line's object; keys whose value is not a number are left out (with a warning), NaN and infinite
        values are None (JSON null: strict JSON parsers reject bare NaN)."""
        try:
            row: dict[str, Any] = {"step": int(step)}
        except (TypeError, ValueError, OverflowError) as exc:
            self._warn("step", f"JSONLLogger: step {step!r} is not an integer ({exc}); metrics not written")
            return None
        for key, value in metrics.items():
            try:
                number = float(value)
            except (TypeError, ValueError, OverflowError) as exc:
                self._warn(
                    f"value:{key}",
                    f"JSONLLogger: {key} = {value!r} at step {step} is not a number ({exc}); left out of "
                    f"{self.path}",
                )
                continue
            row[key] = number if math.isfinite(number) else None
            if row[key] is None:
                self._warn(
                    "nonfinite",
                    f"JSONLLogger: {key} = {number} at step {step} is not a finite number; written to "
                    f"{self.path} as null, as are later ones",
                )
        return row

    def _write(self, fd: int, line: str, step: int) -> bool:
        """Append `line` whole in one write, under the file's lock when it can be had; True when written."""
        locked = lock(fd)
        if not locked:
            self._warn(
                "lock",
                f"JSONLLogger: cannot lock {self.path} (no flock, or another writer holds it for over "
                f"{LOCK_WAIT_S:g} s); lines are still appended whole, but a failed write's part stays in place",
            )
        try:
            return self._append(fd, line.encode("utf-8"), step, locked)
        finally:
            if locked:
                unlock(fd)

    def _append(self, fd: int, data: bytes, step: int, locked: bool) -> bool:
        """One `os.write` of `data` (after a newline when the file's last line is cut off); a failed write's
        own part is removed when `locked`. True when written whole."""
        start = written = 0
        try:
            start = os.fstat(fd).st_size
            if not ends_a_line(fd, start):
                data = b"\n" + data
            written = os.write(fd, data)
            if written == len(data):
                return True
            reason = f"only {written} of {len(data)} bytes fit: the disk or the file size limit is full"
            kind = "short"
        except OSError as exc:
            reason, kind = str(exc), error_kind(exc)
        removed = written == 0 or (locked and remove_own_part(fd, start, written))
        left = "" if removed else "; the part written stays as a line readers skip; the next starts afresh"
        self._warn(
            f"write:{kind}",
            f"JSONLLogger: metrics at step {step} not written to {self.path} ({reason}); training goes on and "
            f"later steps are tried again{left}",
        )
        return False

    def _note_steps(self, row: Mapping[str, Any]) -> None:
        step = row["step"]
        keys = [key for key in row if key != "step"]
        again = [key for key in keys if step in self._logged.get(key, ())]
        for key in keys:
            self._logged.setdefault(key, set()).add(step)
        if again:
            self._warn(
                "step-again",
                f"JSONLLogger: {self.path} now holds step {step} twice ({again[0]}, ...): a job resumed from an "
                "earlier checkpoint re-runs steps; readers (inloop-eval report) keep the last value of each "
                "(step, key)",
            )

    def finish(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.close(fd)
        except OSError as exc:
            self._warn("close", f"JSONLLogger: closing {self.path} failed ({exc}); earlier lines are on disk")
