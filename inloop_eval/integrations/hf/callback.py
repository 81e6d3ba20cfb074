"""A Hugging Face `transformers.Trainer` callback that runs the in-loop evaluator every `eval_interval` steps.

    trainer = Trainer(model=model, args=args, train_dataset=train)
    trainer.add_callback(InLoopEvalCallback(evaluator, trainer=trainer))
    trainer.train()

With `trainer` given, the figures go through `trainer.log`: into `trainer.state.log_history` and to every
`report_to` integration (note that transformers' own W&B callback files keys not starting with `eval_` under
`train/`). Without it they are appended to `state.log_history` directly. A `logger` (e.g. a
`WandbLogger` or `JSONLLogger`) receives them too, with the step.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from inloop_eval.integrations import EvalSchedule, run_and_log
from inloop_eval.loggers import MetricsLogger


class InLoopEvalCallback(TrainerCallback):
    """Evaluates at `state.global_step` when `evaluator.should_run` says so: before the first step (step 0,
    or the step a resumed run starts from) and after every optimizer step."""

    def __init__(self, evaluator: Any, *, trainer: Any = None, logger: MetricsLogger | None = None) -> None:
        self.evaluator = evaluator
        self.trainer = trainer
        self.logger = logger
        self.schedule = EvalSchedule(evaluator)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.maybe_evaluate(state, kwargs.get("model"))

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.maybe_evaluate(state, kwargs.get("model"))

    def maybe_evaluate(self, state: TrainerState, model: Any) -> None:
        step = state.global_step
        if model is None or not self.schedule.due(step):
            return
        metrics = run_and_log(self.evaluator, model, step, self.logger)
        if self.trainer is not None:
            self.trainer.log(dict(metrics))
        else:
            state.log_history.append({**metrics, "step": step})
