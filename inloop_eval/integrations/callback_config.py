"""The fields and rules every trainer callback config of ours shares: what to evaluate (`tasks`, or an
evaluator `config` file), how (`limit`, `batch_tokens`, `strict`, `data_root`), and the longest context the
trainer allows.

`TaskCallbackFields` is the keyword-only base of OLMo-core's `InLoopEvalCallbackConfig` and torchtitan's
`InLoopValidator.Config`; each adds its trainer's own fields (OLMo-core's `task_set`, `tokenizer`,
`key_style`; torchtitan's `freq`, `loss_validation`) and says when to evaluate. `check_trained_length` is the
context-length rule the perplexity callback config shares with them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from inloop_eval.config_fields import read_config_file
from inloop_eval.errors import ConfigError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.downstream import TaskEvalConfig

DEFAULT_BATCH_TOKENS = TaskEvalConfig.__dataclass_fields__["batch_tokens"].default


@dataclass(kw_only=True)
class TaskCallbackFields:
    """What a trainer callback evaluates: `tasks` (each with `limit` and `batch_tokens`) or an evaluator
    `config` file, never both. Messages name the config by its class (`InLoopValidator.Config`)."""

    tasks: list[str] | None = None
    """Task ids (`inloop-eval tasks` lists them; `olmo:<label>` for OLMo's labels), each evaluated with
    `limit` and `batch_tokens`."""
    config: str | None = None
    """Path of an evaluator YAML config (`configs/`), instead of `tasks`; its `eval_interval` is replaced by
    the trainer callback's own schedule."""
    limit: int | None = None
    """Evaluate only the first `limit` documents of each of `tasks`."""
    batch_tokens: int = DEFAULT_BATCH_TOKENS
    """Token budget of one forward pass for each of `tasks`."""
    strict: bool = False
    """Raise a task's failure (stopping training) instead of recording `.../failed = 1` and going on."""
    data_root: str | None = None
    """Task data and fetched tokenizers; default `$INLOOP_EVAL_DATA` or `~/.cache/inloop_eval/data`."""

    # The fields that name what to evaluate (exactly one is given), each with a hint for the message.
    TASK_SOURCES: ClassVar[dict[str, str]] = {
        "tasks": "e.g. tasks=['piqa']",
        "config": "an evaluator YAML file",
    }
    # The fields that apply to `tasks` only: with `config`, that file sets them.
    TASK_ONLY_FIELDS: ClassVar[tuple[str, ...]] = ("limit", "batch_tokens")

    def __post_init__(self) -> None:
        self.check_one_task_source()
        self.check_task_only_fields()
        if isinstance(self.tasks, str) or (
            self.tasks is not None and not all(isinstance(t, str) for t in self.tasks)
        ):
            raise ConfigError(
                f"{self.where}: `tasks` must be a list of task ids, e.g. tasks=['piqa'], found {self.tasks!r}"
            )
        if self.tasks is not None and not self.tasks:
            raise ConfigError(f"{self.where}: `tasks` lists no task; name at least one, e.g. tasks=['piqa']")
        if self.batch_tokens < 1:
            raise ConfigError(f"{self.where}: batch_tokens must be >= 1, found {self.batch_tokens}")

    @property
    def where(self) -> str:
        """The config's name in messages."""
        return type(self).__qualname__

    def check_one_task_source(self) -> None:
        """ConfigError unless exactly one of `TASK_SOURCES` is given."""
        sources = {name: getattr(self, name) for name in self.TASK_SOURCES}
        if list(sources.values()).count(None) == len(sources) - 1:
            return
        options = [f"`{name}` ({hint})" for name, hint in self.TASK_SOURCES.items()]
        found = ", ".join(f"{name}={value!r}" for name, value in sources.items())
        raise ConfigError(
            f"{self.where}: name either {', '.join(options[:-1])} or {options[-1]}, found {found}"
        )

    def check_task_only_fields(self) -> None:
        """ConfigError for a field of `TASK_ONLY_FIELDS` changed from its default beside `config`."""
        if self.config is None:
            return
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        if all(getattr(self, name) == defaults[name] for name in self.TASK_ONLY_FIELDS):
            return
        names = [f"`{name}`" for name in self.TASK_ONLY_FIELDS]
        raise ConfigError(
            f"{self.where}: {', '.join(names[:-1])} and {names[-1]} apply to `tasks`; with "
            f"config={self.config!r} set them in that file"
        )

    def task_ids(self) -> list[str]:
        """The task ids this config names (none with `config`)."""
        return list(self.tasks or [])

    def task_settings(self) -> dict[str, Any]:
        """Evaluator settings of this config's own for `tasks` (with `config`, that file sets them)."""
        return {}

    def described_config(
        self, *, eval_interval: int, trained_length: int | None, trained_length_name: str
    ) -> EvaluatorConfig:
        """The `EvaluatorConfig` this config describes, evaluated every `eval_interval` steps; its
        `max_length` the trainer's `trained_length` (named `trained_length_name` in messages; a config file
        may only lower it), None: the config's own."""
        data, where = self.config_data()
        data["eval_interval"] = eval_interval
        if self.strict:
            data["strict"] = True
        if self.data_root is not None:
            data["data_root"] = self.data_root
        config = EvaluatorConfig.from_dict(data, where)
        check_trained_length(where, "max_length", config.max_length, trained_length, trained_length_name)
        config.max_length = config.max_length or trained_length
        return config

    def config_data(self) -> tuple[dict[str, Any], str]:
        """(the evaluator config as a dict, its name in messages): read from `config`, or made of `tasks`."""
        if self.config is not None:
            return dict(read_config_file(self.config)), self.config
        entries = [
            {"task": t, "limit": self.limit, "batch_tokens": self.batch_tokens} for t in self.task_ids()
        ]
        return {"evaluators": entries, **self.task_settings()}, self.where


def check_trained_length(
    where: str,
    what: str,
    length: int | None,
    trained_length: int | None,
    trained_length_name: str,
    fix: str = "lower it or leave it out",
) -> None:
    """ConfigError when `length` (`what`) is longer than the trainer's `trained_length`: positions past it
    were never trained on. Either None: nothing to check."""
    if trained_length is not None and trained_length < 2:
        raise ConfigError(
            f"{where}: {trained_length_name} must be at least 2 tokens (a context and a continuation), found "
            f"{trained_length}; pass the trainer's training sequence length"
        )
    if length is None or trained_length is None or length <= trained_length:
        return
    raise ConfigError(
        f"{where}: {what} {length} is longer than {trained_length_name} {trained_length}, past the positions "
        f"the model was trained on; {fix}"
    )
