"""Evaluator configuration: keyword-only dataclasses, loaded from YAML files in `configs/`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inloop_eval.errors import ConfigError

EVALUATOR_TYPES = ("downstream",)


@dataclass(kw_only=True)
class TaskEvalConfig:
    """One evaluator of the list: a downstream task and how to batch it."""

    task: str
    """Task id from the registry (`inloop-eval tasks` lists them)."""
    label: str = ""
    """Name in metric keys (`eval/downstream/<label>/<metric>`); defaults to the task id."""
    type: str = "downstream"
    """Evaluator type: `downstream` (multiple-choice by loglikelihood)."""
    batch_tokens: int = 8192
    """Token budget of one forward pass (rows x longest row, padding included)."""
    limit: int | None = None
    """Evaluate only the first `limit` documents of the split."""
    metrics: list[str] | None = None
    """Figures to report instead of the task's defaults (a subset of `inloop_eval.tasks.ALL_METRICS`)."""
    subset_num_batches: int | None = None
    """Evaluate only the leading documents that fit in this many batches of `batch_tokens` (whole
    documents, in order, at least one), for cheap frequent evals. The budget is for the whole task, not
    per rank, so every world size scores the same documents; the documents left out are counted in
    `n_skipped_docs`. null: every document (up to `limit`)."""

    def __post_init__(self) -> None:
        if not self.task:
            raise ConfigError("evaluator: `task` is required, e.g. `task: piqa`")
        self.label = self.label or self.task
        if self.label != self.label.lower() or " " in self.label:
            raise ConfigError(
                f"evaluator {self.task!r}: label {self.label!r} must be lower-case without spaces"
            )
        if self.type not in EVALUATOR_TYPES:
            raise ConfigError(
                f"evaluator {self.label!r}: type must be one of {EVALUATOR_TYPES}, found {self.type!r}"
            )
        if self.batch_tokens < 1:
            raise ConfigError(
                f"evaluator {self.label!r}: batch_tokens must be >= 1, found {self.batch_tokens}"
            )
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"evaluator {self.label!r}: limit must be >= 1 or null, found {self.limit}")
        if self.subset_num_batches is not None and (
            isinstance(self.subset_num_batches, bool)
            or not isinstance(self.subset_num_batches, int)
            or self.subset_num_batches < 1
        ):
            raise ConfigError(
                f"evaluator {self.label!r}: subset_num_batches must be an integer >= 1 or null, "
                f"found {self.subset_num_batches!r}"
            )
        if self.metrics is not None:
            from inloop_eval.tasks import ALL_METRICS

            unknown = sorted(set(self.metrics) - set(ALL_METRICS))
            if unknown:
                raise ConfigError(
                    f"evaluator {self.label!r}: unknown metrics {unknown}; choose from {list(ALL_METRICS)}"
                )


@dataclass(kw_only=True)
class EvaluatorConfig:
    """Everything `InLoopEvaluator` needs; logged whole with each run."""

    evaluators: list[TaskEvalConfig] = field(default_factory=list)
    """The tasks to run at each evaluation, in order."""
    eval_interval: int = 1000
    """`should_run(step)` is true when `step % eval_interval == 0`."""
    tokenizer: str | None = None
    """Path of a `tokenizers` JSON file or a Hugging Face tokenizer directory (unless one is passed in)."""
    data_root: str | None = None
    """Local task data in OLMo's layout; default `$INLOOP_EVAL_DATA` or `~/.cache/inloop_eval/data`."""
    max_length: int | None = None
    """Longest input in tokens; default: the model's own (position embeddings), else 2048."""
    strict: bool = False
    """Re-raise a task's failure instead of reporting `eval/downstream/<task>/failed = 1`."""
    compiler_reset: bool = False
    """Call `torch.compiler.reset()` after each evaluation, dropping every graph torch.compile holds
    (training's too: its next step recompiles). Evaluation itself runs the uncompiled module
    (`torch.compile`'s `_orig_mod`); use this when submodules compiled in place saw the eval shapes."""

    def __post_init__(self) -> None:
        self.evaluators = [
            e if isinstance(e, TaskEvalConfig) else build_dataclass(TaskEvalConfig, e, "evaluators[]")
            for e in self.evaluators
        ]
        if self.eval_interval < 1:
            raise ConfigError(f"eval_interval must be >= 1, found {self.eval_interval}")
        if self.max_length is not None and self.max_length < 2:
            raise ConfigError(f"max_length must be >= 2 or null, found {self.max_length}")
        if not isinstance(self.compiler_reset, bool):
            raise ConfigError(f"compiler_reset must be true or false, found {self.compiler_reset!r}")
        labels = [e.label for e in self.evaluators]
        duplicated = sorted({x for x in labels if labels.count(x) > 1})
        if duplicated:
            raise ConfigError(
                f"evaluator labels must be unique; repeated: {duplicated} (set `label:` to tell them apart)"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvaluatorConfig:
        return build_dataclass(cls, data, "config")

    @classmethod
    def from_yaml(cls, path: str | Path) -> EvaluatorConfig:
        import yaml

        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: not valid YAML ({exc})") from None
        if not isinstance(data, dict):
            raise ConfigError(
                f"config file {path}: expected a mapping at the top, found {type(data).__name__}"
            )
        return build_dataclass(cls, data.get("evaluation", data), str(path))


def build_dataclass(cls: type, data: Any, where: str) -> Any:
    """`cls(**data)` for a keyword-only config dataclass, with errors that name `where` and the keys."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, found {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown} for {cls.__name__}; known keys: {sorted(names)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
