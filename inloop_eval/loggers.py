"""Where the evaluator's figures go: nowhere (the default), Weights & Biases, or a JSON-lines file.

Every logger takes the evaluator's plain `{key: float}` dict with the trainer's step, `log(metrics, step)`,
and records the whole configuration once with `log_config(config)`. Only rank 0 writes; on other ranks the
loggers do nothing, and W&B is imported only by a `WandbLogger` on rank 0.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from inloop_eval.distributed import world
from inloop_eval.files import write_text_atomically

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
# Curves drawn together per task: the acc vs acc_norm view.
CURVE_METRICS: tuple[str, ...] = ("acc", "acc_norm", "acc_pmi")
DOWNSTREAM_PREFIX = "eval/downstream/"


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
    """Hands every call to each of several loggers, in order."""

    def __init__(self, loggers: Iterable[MetricsLogger]) -> None:
        self.loggers = list(loggers)

    def log_config(self, config: Any) -> None:
        for logger in self.loggers:
            logger.log_config(config)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for logger in self.loggers:
            logger.log(metrics, step)

    def finish(self) -> None:
        for logger in self.loggers:
            logger.finish()


class JSONLLogger(MetricsLogger):
    """`<run_dir>/metrics.jsonl`, one line `{"step": step, key: value, ...}` per call, flushed at once;
    `<run_dir>/config.json` for the config. What `inloop-eval report RUN_DIR` reads.

    run_dir: created if missing. append: keep earlier lines (a resumed run) instead of starting afresh.
    """

    def __init__(self, run_dir: str | Path, *, append: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self._file = None
        if is_rank_zero():
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._file = (self.run_dir / METRICS_FILE).open("a" if append else "w")

    @property
    def path(self) -> Path:
        return self.run_dir / METRICS_FILE

    def log_config(self, config: Any) -> None:
        if self._file is None:
            return
        text = json.dumps(as_dict(config), indent=2, sort_keys=True, default=str)
        write_text_atomically(self.run_dir / CONFIG_FILE, text)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps({"step": int(step), **{k: float(v) for k, v in metrics.items()}}) + "\n")
        self._file.flush()

    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


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
        if self.run is not None:
            self.run.config.update(as_dict(config), allow_val_change=True)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self.run is None:
            return
        row: dict[str, Any] = {k: float(v) for k, v in metrics.items()}
        row[self.step_key] = int(step)
        if self.charts:
            row.update(self._charts(metrics, step))
        self.run.log(row)

    def _charts(self, metrics: Mapping[str, float], step: int) -> dict[str, Any]:
        """The acc vs acc_norm chart of every task with a curve metric in `metrics`, over all steps so far."""
        touched: set[str] = set()
        for key, value in metrics.items():
            if not key.startswith(DOWNSTREAM_PREFIX):
                continue
            label, _, metric = key[len(DOWNSTREAM_PREFIX) :].rpartition("/")
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
        if self.run is not None:
            self.run.finish()
            self.run = None
