"""`WandbLogger`: a W&B run on rank 0 (offline unless told otherwise), with a per-task acc vs acc_norm chart.
W&B is imported only when a `WandbLogger` starts on rank 0; `wandb_file` reads the run back."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inloop_eval.keys import DOWNSTREAM, PREFIX, split_key
from inloop_eval.loggers.base import CURVE_METRICS, MetricsLogger, WarnOnce, as_dict, error_kind, is_rank_zero


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
        for glob in (f"{PREFIX}/*", *step_globs):
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
