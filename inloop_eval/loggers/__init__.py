"""Where the evaluator's figures go: nowhere (the default), Weights & Biases, or a JSON-lines file.

Every logger takes the evaluator's plain `{key: float}` dict with the trainer's step, `log(metrics, step)`,
and records the whole configuration once with `log_config(config)`. Only rank 0 writes; on other ranks the
loggers do nothing, and W&B is imported only by a `WandbLogger` on rank 0.

Logging never stops training: a logger's `log`, `log_config` and `finish` catch their own failures (a full
disk, a W&B error), warn once per kind of failure and return.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from inloop_eval.data.files import write_text_atomically
from inloop_eval.distributed import world
from inloop_eval.errors import InLoopEvalError
from inloop_eval.keys import DOWNSTREAM, split_key

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
# Curves drawn together per task: the acc vs acc_norm view.
CURVE_METRICS: tuple[str, ...] = ("acc", "acc_norm", "acc_pmi")


class LoggerError(InLoopEvalError):
    """A logger that cannot start (its run directory cannot be created or its file opened)."""


class WarnOnce:
    """Warns the first time each kind of failure happens: a full disk warns once, not at every step."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, kind: str, message: str) -> None:
        if kind not in self.seen:
            self.seen.add(kind)
            log.warning("%s (shown once)", message)


def error_kind(exc: BaseException) -> str:
    """`ENOSPC`, `EIO`, ... for an OSError, else the exception's type name."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return type(exc).__name__


def truncate(fd: int, size: int) -> bool:
    """Cut the file open as `fd` back to `size` bytes; False when that fails too."""
    try:
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)
        return True
    except OSError:
        return False


def is_rank_zero() -> bool:
    """True on the process that logs: rank 0 of the process group, else of `torchrun`'s `RANK`."""
    world_size, rank = world()
    if world_size > 1:
        return rank == 0
    return int(os.environ.get("RANK", "0")) == 0


def as_dict(config: Any) -> dict[str, Any]:
    """A config dataclass (or mapping) as a plain nested dict, for JSON and W&B."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return dict(config or {})


class MetricsLogger:
    """The logger interface; this base class is the no-op default."""

    def log_config(self, config: Any) -> None:
        """Record the whole configuration (a dataclass or a mapping)."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record `metrics` at the trainer's `step`."""

    def finish(self) -> None:
        """Flush and close."""

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.finish()


class NullLogger(MetricsLogger):
    """Logs nothing."""


class MultiLogger(MetricsLogger):
    """Hands every call to each of several loggers, in order; one that fails does not keep the call from the
    others (nor from the training loop)."""

    def __init__(self, loggers: Iterable[MetricsLogger]) -> None:
        self.loggers = list(loggers)
        self._warn = WarnOnce()

    def log_config(self, config: Any) -> None:
        for logger in self.loggers:
            self._call(logger, "log_config", config)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for logger in self.loggers:
            self._call(logger, "log", metrics, step)

    def finish(self) -> None:
        for logger in self.loggers:
            self._call(logger, "finish")

    def _call(self, logger: MetricsLogger, method: str, *args: Any) -> None:
        # Our loggers catch their own failures; this catches those of a logger written elsewhere.
        try:
            getattr(logger, method)(*args)
        except Exception as exc:
            name = type(logger).__name__
            self._warn(
                f"{name}.{method}:{error_kind(exc)}",
                f"MultiLogger: {name}.{method} failed ({type(exc).__name__}: {exc}); the other loggers and "
                "training go on without it for this call",
            )


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


class WandbLogger(MetricsLogger):
    """A W&B run on rank 0, offline unless told otherwise, with every `eval/*` series plotted against the
    trainer's step and, per task, one line-series chart of acc, acc_norm and acc_pmi.

    mode: "offline", "online" or "disabled"; when None, `$WANDB_MODE`, else "offline" (works without an
        account; `wandb sync <run dir>` uploads it later).
    config: logged as the run's config (e.g. the whole `EvaluatorConfig`); `log_config` adds to it.
    step_key: the history key holding the trainer's step; `eval/*` and further `step_globs` (e.g. `train/*`)
        are plotted against it, so W&B's own `_step` never has to match the trainer's.
    charts: log the per-task line-series chart at every evaluation (`charts/<task>/acc_vs_acc_norm`).
    init_kwargs: passed on to `wandb.init` (entity, group, tags, settings, ...).
    """

    def __init__(
        self,
        *,
        project: str = "inloop-eval",
        name: str | None = None,
        dir: str | Path | None = None,
        mode: str | None = None,
        config: Any = None,
        step_key: str = "trainer/step",
        step_globs: tuple[str, ...] = (),
        charts: bool = True,
        **init_kwargs: Any,
    ) -> None:
        self.run: Any = None
        self.step_key = step_key
        self.charts = charts
        self._warn = WarnOnce()
        self._curves: dict[str, dict[str, list[tuple[int, float]]]] = {}
        if not is_rank_zero():
            return
        import wandb

        if dir is not None:
            Path(dir).mkdir(parents=True, exist_ok=True)
        self._wandb = wandb
        self.run = wandb.init(
            project=project,
            name=name,
            dir=str(dir) if dir is not None else None,
            mode=mode or os.environ.get("WANDB_MODE") or "offline",
            config=as_dict(config),
            **init_kwargs,
        )
        self.run.define_metric(step_key)
        for glob in ("eval/*", *step_globs):
            self.run.define_metric(glob, step_metric=step_key)

    @property
    def run_dir(self) -> Path | None:
        """The local directory of the run (`.../wandb/offline-run-*`), rank 0 only."""
        return Path(self.run.dir).parent if self.run is not None else None

    def log_config(self, config: Any) -> None:
        if self.run is None:
            return
        try:
            self.run.config.update(as_dict(config), allow_val_change=True)
        except Exception as exc:  # wandb raises its own types, OSError, ...: none may stop training
            self._failed("log_config", exc)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self.run is None:
            return
        try:
            row: dict[str, Any] = {k: float(v) for k, v in metrics.items()}
            row[self.step_key] = int(step)
            if self.charts:
                row.update(self._charts(metrics, step))
            self.run.log(row)
        except Exception as exc:
            self._failed("log", exc, f" at step {step}")

    def _failed(self, method: str, exc: Exception, where: str = "") -> None:
        self._warn(
            f"{method}:{error_kind(exc)}",
            f"WandbLogger.{method}{where} failed ({type(exc).__name__}: {exc}); training goes on",
        )

    def _charts(self, metrics: Mapping[str, float], step: int) -> dict[str, Any]:
        """The acc vs acc_norm chart of every task with a curve metric in `metrics`, over all steps so far."""
        touched: set[str] = set()
        for key, value in metrics.items():
            parts = split_key(key, DOWNSTREAM)
            if parts is None:
                continue
            label, metric = parts
            if metric in CURVE_METRICS:
                self._curves.setdefault(label, {}).setdefault(metric, []).append((int(step), float(value)))
                touched.add(label)
        charts = {}
        for label in sorted(touched):
            curves = {m: self._curves[label][m] for m in CURVE_METRICS if m in self._curves[label]}
            charts[f"charts/{label}/acc_vs_acc_norm"] = self._wandb.plot.line_series(
                xs=[[s for s, _ in points] for points in curves.values()],
                ys=[[v for _, v in points] for points in curves.values()],
                keys=list(curves),
                title=f"{label}: {' vs '.join(curves)}",
                xname=self.step_key,
            )
        return charts

    def finish(self) -> None:
        if self.run is None:
            return
        run, self.run = self.run, None
        try:
            run.finish()
        except Exception as exc:
            self._failed("finish", exc)
