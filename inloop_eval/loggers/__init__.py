"""Where the evaluator's figures go: nowhere (the default), Weights & Biases, or a JSON-lines file.

Modules:
- `base`: the `MetricsLogger` interface (`log_config`, `log`, `finish`) and its no-op default `NullLogger`,
  `MultiLogger` (hands each call to several loggers), and what they share: rank 0 only (`is_rank_zero`),
  failures warned about once (`WarnOnce`) and never raised into training, `LoggerError`, `CURVE_METRICS`.
- `jsonl`: `JSONLLogger`, `<run_dir>/metrics.jsonl` and `config.json` (`METRICS_FILE`, `CONFIG_FILE`).
- `outcomes`: per-document outcomes on disk, `<run_dir>/outcomes/step_<N>.npz` (`OutcomesWriter`, `read_step`;
  the format is in its docstring), written by `JSONLLogger.log_outcomes`; `outcomes_archive` reads such a
  file member by member, each header checked before its data.
- `wandb`: `WandbLogger`, a W&B run (W&B imported only when one starts on rank 0).
- `wandb_file`: reading a W&B run back from its `.wandb` file, offline.
- `summary`: the table of figures a command ends with (`evaluate`, `watch`): a row per task and figure.
- `progress`: what a run shows while it goes: an evaluation's bars or lines (`EvaluationProgress`) and the
  demo's training line with its ETA (`TrainingProgress`); used by the command line and the demo, not
  re-exported here (it loads tqdm).

The names below are re-exported here, so `from inloop_eval.loggers import JSONLLogger, WandbLogger,
MultiLogger, MetricsLogger, ...` keeps working.
"""

from inloop_eval.loggers.base import (
    CURVE_METRICS,
    LoggerError,
    MetricsLogger,
    MultiLogger,
    NullLogger,
    WarnOnce,
    as_dict,
    error_kind,
    is_rank_zero,
)
from inloop_eval.loggers.jsonl import CONFIG_FILE, METRICS_FILE, JSONLLogger
from inloop_eval.loggers.wandb import WandbLogger

__all__ = [
    "CONFIG_FILE",
    "CURVE_METRICS",
    "METRICS_FILE",
    "JSONLLogger",
    "LoggerError",
    "MetricsLogger",
    "MultiLogger",
    "NullLogger",
    "WandbLogger",
    "WarnOnce",
    "as_dict",
    "error_kind",
    "is_rank_zero",
]
