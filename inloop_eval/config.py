"""Evaluator configuration: keyword-only dataclasses, loaded from YAML files in `configs/`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from inloop_eval.errors import ConfigError
from inloop_eval.metrics.registry import ALL_METRICS, unknown_metrics

EVALUATOR_TYPES = ("downstream",)


def repeated(labels: list[str]) -> list[str]:
    """The labels that occur more than once, sorted."""
    return sorted({x for x in labels if labels.count(x) > 1})


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
    """Figures to report instead of the task's defaults (names from `inloop_eval.metrics.registry.ALL_METRICS`)."""
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
            unknown = unknown_metrics(self.metrics)
            if unknown:
                raise ConfigError(
                    f"evaluator {self.label!r}: unknown metrics {unknown}; choose from {list(ALL_METRICS)}"
                )


LM_FORMATS = ("memmap", "jsonl", "text")
LM_DTYPES = ("uint16", "uint32")


def check_lm_label(label: str, where: str) -> None:
    """Domain labels go into keys `eval/lm/<label>/<figure>`: non-empty, lower-case, no spaces or '/'."""
    if not label:
        raise ConfigError(f"{where}: `label` is required, e.g. `label: code`")
    if label != label.lower() or " " in label or "/" in label:
        raise ConfigError(f"{where}: label {label!r} must be lower-case without spaces or '/'")


@dataclass(kw_only=True)
class LMDomainConfig:
    """One domain of an `lm` evaluator: a label and the files holding its held-out text or tokens."""

    label: str
    """Name in metric keys (`eval/lm/<label>/<ce|ppl|bpb>`), e.g. `code`, `books`."""
    paths: list[str]
    """Files or glob patterns (`**` recurses, `~` expands), e.g. `[~/lm/code/*.npy]`; a single string is
    taken as a one-element list."""
    format: str = "memmap"
    """`memmap`: raw token ids (OLMo's `.npy` files), read as sequences of `seq_len`; `jsonl`: one document
    per line in the field `text_field` (`.gz` allowed); `text`: each file is one document."""
    dtype: str = "uint16"
    """Token type of raw `memmap` files (`uint16` or `uint32`); files written by `np.save` carry their own."""
    text_field: str = "text"
    """Field of each JSONL line holding the document (`format: jsonl`)."""
    max_tokens: int | None = None
    """Cap on the predicted tokens of this domain; overrides the evaluator's `max_tokens`."""

    def __post_init__(self) -> None:
        check_lm_label(self.label, "lm domain")
        if isinstance(self.paths, str):
            self.paths = [self.paths]
        if not self.paths or not all(isinstance(p, str) and p for p in self.paths):
            raise ConfigError(
                f"lm domain {self.label!r}: `paths` must list files or globs, e.g. [data/code/*.npy], "
                f"found {self.paths!r}"
            )
        if self.format not in LM_FORMATS:
            raise ConfigError(
                f"lm domain {self.label!r}: format must be one of {LM_FORMATS}, found {self.format!r}"
            )
        if self.dtype not in LM_DTYPES:
            raise ConfigError(
                f"lm domain {self.label!r}: dtype must be one of {LM_DTYPES}, found {self.dtype!r}"
            )
        if not self.text_field:
            raise ConfigError(f"lm domain {self.label!r}: text_field must not be empty")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError(
                f"lm domain {self.label!r}: max_tokens must be >= 1 or null, found {self.max_tokens}"
            )


@dataclass(kw_only=True)
class LMEvalConfig:
    """An evaluator of type `lm`: perplexity per domain label on held-out data (`eval/lm/<label>/...`)."""

    type: str = "lm"
    """Evaluator type; always `lm` for this class."""
    domains: list[LMDomainConfig] = field(default_factory=list)
    """The domain sets, each with its label; reported in this order."""
    seq_len: int = 1024
    """Tokens per sequence: memmap files are cut into sequences of this length; text documents into
    windows of at most this length. A sequence of L tokens predicts L - 1 of them."""
    batch_tokens: int = 8192
    """Token budget of one forward pass (rows x longest row); at least `seq_len`."""
    max_tokens: int | None = None
    """Cap on the predicted tokens of each domain (whole sequences, a fixed seeded choice); null: all."""
    cache_dir: str | None = None
    """Where tokenized text domains are cached; default `<home>/lm_cache` (`$INLOOP_EVAL_HOME`)."""

    def __post_init__(self) -> None:
        if self.type != "lm":
            raise ConfigError(f"lm evaluator: type must be 'lm', found {self.type!r}")
        self.domains = [
            d if isinstance(d, LMDomainConfig) else build_dataclass(LMDomainConfig, d, f"lm domains[{i}]")
            for i, d in enumerate(self.domains)
        ]
        if not self.domains:
            raise ConfigError(
                "lm evaluator: `domains` must list at least one domain, e.g. "
                "[{label: code, paths: [data/code/*.npy]}]"
            )
        labels = [d.label for d in self.domains]
        duplicated = repeated(labels)
        if duplicated:
            raise ConfigError(f"lm evaluator: domain labels must be unique; repeated: {duplicated}")
        if self.seq_len < 2:
            raise ConfigError(f"lm evaluator: seq_len must be >= 2, found {self.seq_len}")
        if self.batch_tokens < self.seq_len:
            raise ConfigError(
                f"lm evaluator: batch_tokens ({self.batch_tokens}) must be >= seq_len ({self.seq_len}) so "
                "that a whole sequence fits in one forward pass"
            )
        for d in self.domains:
            cap = self.cap(d)
            if cap is not None and cap < self.seq_len - 1:
                raise ConfigError(
                    f"lm domain {d.label!r}: max_tokens ({cap}) must be >= seq_len - 1 ({self.seq_len - 1}), "
                    "the tokens one sequence predicts"
                )

    def cap(self, domain: LMDomainConfig) -> int | None:
        """The token cap that applies to `domain`: its own, else the evaluator's."""
        return domain.max_tokens if domain.max_tokens is not None else self.max_tokens


def build_evaluator_config(data: Any, where: str) -> TaskEvalConfig | LMEvalConfig:
    """One entry of `evaluators:`, by its `type` (`downstream` unless given)."""
    if isinstance(data, (TaskEvalConfig, LMEvalConfig)):
        return data
    if isinstance(data, dict) and data.get("type") == "lm":
        return build_dataclass(LMEvalConfig, data, where)
    return build_dataclass(TaskEvalConfig, data, where)


@dataclass(kw_only=True)
class EvaluatorConfig:
    """Everything `InLoopEvaluator` needs; logged whole with each run."""

    evaluators: list[TaskEvalConfig | LMEvalConfig] = field(default_factory=list)
    """The evaluators to run at each evaluation, in order: tasks (`type: downstream`, the default) and
    domain perplexity (`type: lm`)."""
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
    pad_to_multiple: int = 1
    """Round every batch's width up to a multiple of this many tokens (bucketed shapes, so a model whose
    forward is compiled sees a few widths rather than one per batch); 1 is off. An adapter passed to `run`
    keeps its own setting unless this is set."""
    compiler_reset: bool = False
    """Call `torch.compiler.reset()` after each evaluation, dropping every graph torch.compile holds
    (training's too: its next step recompiles). Evaluation itself runs the uncompiled module
    (`torch.compile`'s `_orig_mod`); use this when submodules compiled in place saw the eval shapes."""

    def __post_init__(self) -> None:
        self.evaluators = [build_evaluator_config(e, "evaluators[]") for e in self.evaluators]
        if self.eval_interval < 1:
            raise ConfigError(f"eval_interval must be >= 1, found {self.eval_interval}")
        if self.max_length is not None and self.max_length < 2:
            raise ConfigError(f"max_length must be >= 2 or null, found {self.max_length}")
        if isinstance(self.pad_to_multiple, bool) or not isinstance(self.pad_to_multiple, int):
            raise ConfigError(f"pad_to_multiple must be an integer >= 1, found {self.pad_to_multiple!r}")
        if self.pad_to_multiple < 1:
            raise ConfigError(
                f"pad_to_multiple must be an integer >= 1 (1 = off), found {self.pad_to_multiple}"
            )
        if not isinstance(self.compiler_reset, bool):
            raise ConfigError(f"compiler_reset must be true or false, found {self.compiler_reset!r}")
        labels = [e.label for e in self.evaluators if isinstance(e, TaskEvalConfig)]
        duplicated = repeated(labels)
        if duplicated:
            raise ConfigError(
                f"evaluator labels must be unique; repeated: {duplicated} (set `label:` to tell them apart)"
            )
        lm_labels = [d.label for e in self.evaluators if isinstance(e, LMEvalConfig) for d in e.domains]
        duplicated = repeated(lm_labels)
        if duplicated:
            raise ConfigError(
                f"lm domain labels must be unique across `lm` evaluators; repeated: {duplicated}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvaluatorConfig:
        return build_dataclass(cls, data, "config")

    @classmethod
    def from_yaml(cls, path: str | Path) -> EvaluatorConfig:
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
