"""A PyTorch Lightning callback that runs the in-loop evaluator every `eval_interval` optimizer steps.

    trainer = L.Trainer(max_steps=..., callbacks=[InLoopEvalCallback(evaluator)], logger=...)

The figures go to the trainer's loggers at `trainer.global_step` (and into `trainer.callback_metrics`);
a `MetricsLogger` (e.g. `WandbLogger`, `JSONLLogger`) receives them too.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from inloop_eval.integrations import EvalSchedule, run_and_log
from inloop_eval.loggers import MetricsLogger


class InLoopEvalCallback(pl.Callback):
    """Evaluates `pl_module` before the first step (when `should_run(0)`) and after each optimizer step
    whose `trainer.global_step` the evaluator's `should_run` accepts.

    model_attr: evaluate `getattr(pl_module, model_attr)` (e.g. `"model"`, a reference GPT or a Hugging Face
        model that the evaluator drives directly) instead of `pl_module`, which must then map input ids
        [B, T] to logits [B, T, V].
    """

    def __init__(
        self, evaluator: Any, *, model_attr: str | None = None, logger: MetricsLogger | None = None
    ) -> None:
        self.evaluator = evaluator
        self.model_attr = model_attr
        self.logger = logger
        self.schedule = EvalSchedule(evaluator)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.maybe_evaluate(trainer, pl_module)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.maybe_evaluate(trainer, pl_module)

    def maybe_evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        step = trainer.global_step
        if not self.schedule.due(step):
            return
        model = getattr(pl_module, self.model_attr) if self.model_attr else pl_module
        metrics = run_and_log(self.evaluator, model, step, self.logger)
        # Already synced across ranks by the evaluator: no further reduction.
        for lg in trainer.loggers:
            lg.log_metrics(metrics, step=step)
        trainer.callback_metrics.update({k: _tensor(v) for k, v in metrics.items()})


def _tensor(value: float) -> Any:
    return torch.tensor(value)
