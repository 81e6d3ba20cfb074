"""`JSONLLogger`: the run directory's `metrics.jsonl` (one JSON line per call) and `config.json`, appended to
and never rewritten; what `inloop-eval report RUN_DIR` reads."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inloop_eval.data.files import write_text_atomically
from inloop_eval.loggers.base import LoggerError, MetricsLogger, WarnOnce, as_dict, error_kind, is_rank_zero

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"


def truncate(fd: int, size: int) -> bool:
    """Cut the file open as `fd` back to `size` bytes; False when that fails too."""
    try:
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)
        return True
    except OSError:
        return False


class JSONLLogger(MetricsLogger):
    """`<run_dir>/metrics.jsonl`, one line `{"step": step, key: value, ...}` per call, written at once;
    `<run_dir>/config.json` for the config. What `inloop-eval report RUN_DIR` reads.

    The file is opened for appending and never rewritten: a resumed job adds to what was logged before. A
    step logged again (a job resumed from an earlier checkpoint re-runs steps) is appended too, with a
    warning; readers keep the last value of each (step, key). A write that fails (a full disk) is cut back
    to where its line started, warned about once per kind of error, and skipped.

    run_dir: created if missing.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._fd: int | None = None
        self._warn = WarnOnce()
        # (key -> steps) already in the file, to notice a step logged twice.
        self._logged: dict[str, set[int]] = {}
        # A line cut off by a crash (or by a failed write that could not be undone) must be ended first.
        self._needs_newline = False
        if not is_rank_zero():
            return
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
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
        """Note the (step, key) pairs an earlier job logged and whether its last line was cut off."""
        try:
            data = self.path.read_bytes() if self.path.is_file() else b""
        except OSError as exc:
            self._warn(
                "read", f"JSONLLogger: cannot read {self.path} ({exc}); steps logged twice go unnoticed"
            )
            return
        self._needs_newline = bool(data) and not data.endswith(b"\n")
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
        line = json.dumps(row) + "\n"
        if self._write(self._fd, ("\n" if self._needs_newline else "") + line, row["step"]):
            self._needs_newline = False
            self._note_steps(row)

    def _row(self, metrics: Mapping[str, float], step: int) -> dict[str, Any] | None:
        """The line's object; keys whose value is not a number are left out (with a warning)."""
        try:
            row: dict[str, Any] = {"step": int(step)}
        except (TypeError, ValueError, OverflowError) as exc:
            self._warn("step", f"JSONLLogger: step {step!r} is not an integer ({exc}); metrics not written")
            return None
        for key, value in metrics.items():
            try:
                row[key] = float(value)
            except (TypeError, ValueError, OverflowError) as exc:
                self._warn(
                    f"value:{key}",
                    f"JSONLLogger: {key} = {value!r} at step {step} is not a number ({exc}); left out of "
                    f"{self.path}",
                )
        return row

    def _write(self, fd: int, text: str, step: int) -> bool:
        """Append `text` whole, or cut the file back to where it started; True when written."""
        data = memoryview(text.encode("utf-8"))
        start: int | None = None
        try:
            start = os.fstat(fd).st_size
            while data:  # os.write may write part of it (a nearly full disk)
                data = data[os.write(fd, data) :]
            return True
        except OSError as exc:
            undone = start is not None and truncate(fd, start)
            if not undone:  # else the file is as before, and so is whether it needs a newline first
                self._needs_newline = True
            self._warn(
                f"write:{error_kind(exc)}",
                f"JSONLLogger: metrics at step {step} not written to {self.path} ({exc}); training goes on and "
                "later steps are tried again"
                + ("" if undone else "; the part written could not be removed, the next line starts afresh"),
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
