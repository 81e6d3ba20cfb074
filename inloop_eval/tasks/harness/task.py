"""`HarnessYamlTask`: one lm-evaluation-harness YAML task with `output_type: multiple_choice`, rendered as the
harness's `ConfigurableTask` renders it.

Supported keys: `task`, `include` (one file or a list; the including file wins, then earlier includes over
later ones), `group` / `tag` (the task's groups), group files (`group: name` with `task: [members]`),
`dataset_path` / `dataset_name` / `dataset_kwargs` (a hub path reads the local data root in OLMo's folders;
`json`, `csv`, `parquet` and `arrow` read local `data_files`, relative to the YAML file), `test_split` /
`validation_split` (the evaluated split, test first, as the harness does) / `training_split` /
`fewshot_split`, `process_docs`, `doc_to_text`, `doc_to_choice`, `doc_to_target` (a field name, a Jinja
template, a list, or `!function module.name`), `description` (a template), `target_delimiter`,
`fewshot_delimiter`, `num_fewshot`, `fewshot_config.sampler` (`first_n`; otherwise this package's per-document
seeded sampling, not the harness's sequence-dependent one), `metric_list`.

Safety: loading a task never runs code from a dataset repository (no hub loading, `trust_remote_code` is
dropped), YAML files are read and `!function` references run only from the folder the user named (`loader`),
templates render in the bounded sandbox (`sandbox`), local data files are checked before loading (`local_files`), and
`dataset_kwargs.cache_dir` is ignored, so a YAML file does not choose where files are written.
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from inloop_eval.data.root import load_split
from inloop_eval.errors import ConfigError, TaskDataError
from inloop_eval.tasks.base import MultipleChoiceTask, shown
from inloop_eval.tasks.harness.loader import FunctionRef
from inloop_eval.tasks.harness.local_files import LOCAL_BUILDERS, check_local_files, in_memory
from inloop_eval.tasks.harness.sandbox import render_template

log = logging.getLogger(__name__)

# The harness's metric names this package computes (the harness names are reported as they are).
SUPPORTED_METRICS: tuple[str, ...] = (
    "acc",
    "acc_norm",
    "acc_bytes",
    "acc_mutual_info",
    "brier_score",
    "f1",
    "ece",
)
DEFAULT_METRICS: tuple[str, ...] = ("acc", "acc_norm")  # the harness's default for multiple_choice


class HarnessYamlTask(MultipleChoiceTask):
    """One harness YAML task (after `include:` merging); see the module docstring for the keys."""

    def __init__(self, config: Mapping[str, Any], source: Path, trusted_root: Path) -> None:
        self.config = dict(config)
        self.source = source
        self.trusted_root = trusted_root
        name = self.config.get("task")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"harness YAML {source}: expected `task: <name>`, found {shown(name)}")
        self.name = name
        self.harness_name = name
        if self.config.get("output_type", "generate_until") != "multiple_choice":
            raise ConfigError(
                f"task {name!r} ({source}): output_type {self.config.get('output_type', 'generate_until')!r} "
                "is not supported; expected multiple_choice"
            )
        for key in ("doc_to_text", "doc_to_choice", "doc_to_target"):
            if self.config.get(key) is None:
                raise ConfigError(f"task {name!r} ({source}): `{key}` is required for multiple_choice")
        self.dataset_path = str(self.config.get("dataset_path", ""))
        self.dataset_name = self.config.get("dataset_name")
        split = self.config.get("test_split") or self.config.get("validation_split")
        if not split:
            raise ConfigError(f"task {name!r} ({source}): expected `test_split` or `validation_split`")
        self.split = str(split)
        self.target_delimiter = str(self.config.get("target_delimiter", " "))
        self.fewshot_delimiter = str(self.config.get("fewshot_delimiter", "\n\n"))
        self.num_fewshot = int(self.config.get("num_fewshot") or 0)
        self.fewshot_split = self.config.get("fewshot_split") or self.config.get("training_split")
        sampler = (self.config.get("fewshot_config") or {}).get("sampler", "default")
        self.fewshot_sampler = "first_n" if sampler == "first_n" else "random"
        self.metrics = self._metrics()
        self.format_source = f"lm-evaluation-harness YAML {source}"
        self._features: set[str] = set()
        self._functions: dict[str, Callable[..., Any]] = {}

    def _metrics(self) -> tuple[str, ...]:
        listed = self.config.get("metric_list")
        if listed is None:
            return DEFAULT_METRICS
        names = [m.get("metric") if isinstance(m, Mapping) else m for m in listed]
        unsupported = [n for n in names if n not in SUPPORTED_METRICS]
        if unsupported:
            raise ConfigError(
                f"task {self.name!r} ({self.source}): metrics {unsupported} are not supported for multiple_choice; "
                f"supported: {list(SUPPORTED_METRICS)}"
            )
        return tuple(dict.fromkeys(names))

    def _function(self, key: str) -> Any:
        value = self.config.get(key)
        if isinstance(value, FunctionRef):
            if key not in self._functions:
                self._functions[key] = value.resolve(self.trusted_root, self.name)
            return self._functions[key]
        return value

    # ---- rendering, as lm-evaluation-harness's ConfigurableTask.doc_to_*

    def _template(self, key: str, raw: Mapping[str, Any], index: int) -> str:
        try:
            return render_template(self.config[key], raw)
        except Exception as exc:  # jinja raises many types; all mean the template does not fit the doc
            raise self.error(
                index, f"{key} {shown(self.config[key])}: template failed ({type(exc).__name__}: {exc})"
            ) from None

    def _text(self, raw: Mapping[str, Any], index: int) -> str | int:
        spec = self._function("doc_to_text")
        if callable(spec):
            return spec(raw)
        if isinstance(spec, int):
            return spec
        if isinstance(spec, str) and spec in self._features:
            return raw[spec]
        text = self._template("doc_to_text", raw, index)
        return self._number("doc_to_text", text, index) if text.isdigit() else text

    def _number(self, key: str, text: str, index: int) -> int:
        """A rendering of digits as the harness reads it (`ast.literal_eval`), or an error naming it ("01",
        "²" and numbers of over 4300 digits are digits Python does not read as an int)."""
        try:
            return ast.literal_eval(text)
        except (SyntaxError, ValueError):
            raise self.error(index, f"{key}: expected a choice index, found the digits {shown(text)}") from None

    def _choices(self, raw: Mapping[str, Any], index: int) -> list[str]:
        spec = self._function("doc_to_choice")
        if callable(spec):
            choices = spec(raw)
        elif isinstance(spec, Mapping):
            choices = list(spec.values())
        elif isinstance(spec, list):
            choices = spec
        elif isinstance(spec, str) and spec in self._features:
            choices = raw[spec]
        else:
            rendered = self._template("doc_to_choice", raw, index)
            try:
                choices = ast.literal_eval(rendered)
            except (SyntaxError, ValueError):
                raise self.error(
                    index, f"doc_to_choice: expected a list literal, found {shown(rendered)}"
                ) from None
        if not isinstance(choices, (list, tuple)):
            raise self.error(index, f"doc_to_choice: expected a list of choices, found {shown(choices)}")
        return [str(c) for c in choices]

    def _target(self, raw: Mapping[str, Any], index: int) -> Any:
        spec = self._function("doc_to_target")
        if callable(spec):
            return spec(raw)
        if isinstance(spec, (int, list)):
            return spec
        if isinstance(spec, str) and spec in self._features:
            return raw[spec]
        text = self._template("doc_to_target", raw, index)
        if text.isdigit():
            return self._number("doc_to_target", text, index)
        if len(text) >= 2 and text[0] == "[" and text[-1] == "]":
            try:
                return ast.literal_eval(text)
            except (SyntaxError, ValueError):
                return text
        return text

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str | list[str]:
        text = self._text(raw, index)
        if isinstance(text, int):  # multiple inputs: each choice is a context, the target the continuation
            return self._choices(raw, index)
        if not isinstance(text, str):
            raise self.error(index, f"doc_to_text: expected a string or a choice index, found {shown(text)}")
        return text

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        if isinstance(self._text(raw, index), int):
            return [str(self._target(raw, index))]
        return self._choices(raw, index)

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int | Sequence[int]:
        text = self._text(raw, index)
        choices = self._choices(raw, index)
        gold = text if isinstance(text, int) else self._target(raw, index)
        golds = gold if isinstance(gold, (list, tuple)) else [gold]
        out = []
        for g in golds:
            if isinstance(g, str):
                if g not in choices:
                    raise self.error(
                        index, f"doc_to_target: expected one of the choices {shown(choices)}, found {g!r}"
                    )
                g = choices.index(g)
            out.append(g)
        return out if isinstance(gold, (list, tuple)) else out[0]

    def description_for(self, raw: Mapping[str, Any], subset: str | None) -> str:
        description = self.config.get("description")
        if not description:
            return ""
        try:
            return render_template(description, raw)
        except Exception as exc:  # as in _template: the template does not fit the row
            raise TaskDataError(
                f"task {self.name!r}: description {shown(description)}: template failed "
                f"({type(exc).__name__}: {exc})"
            ) from None

    # ---- data

    def _load_split(self, split: str, data_root: str | Path | None) -> Any:
        kwargs = dict(self.config.get("dataset_kwargs") or {})
        if kwargs.pop("trust_remote_code", None):
            log.warning(
                "task %r: dataset_kwargs.trust_remote_code dropped: no dataset code is ever run", self.name
            )
        if self.dataset_path in LOCAL_BUILDERS:
            files = kwargs.pop("data_files", None)
            if files is None:
                raise ConfigError(
                    f"task {self.name!r} ({self.source}): dataset_path {self.dataset_path!r} needs dataset_kwargs.data_files"
                )
            files = self._local_files(files)
            check_local_files(self.name, self.dataset_path, files)
            kwargs.pop("revision", None)
            if kwargs.pop("cache_dir", None) is not None:  # a YAML file does not choose where we write
                log.warning(
                    "task %r: dataset_kwargs.cache_dir ignored: the datasets library's own cache is used",
                    self.name,
                )
            import datasets  # deferred: importing datasets (with pandas and pyarrow) costs most of a second

            try:
                loaded = datasets.load_dataset(
                    self.dataset_path, self.dataset_name, data_files=files, split=split, **kwargs
                )
            except Exception as exc:  # datasets raises many types for missing or malformed files
                cause = exc.__cause__  # "An error occurred while generating the dataset" names no row
                because = f" ({type(cause).__name__}: {str(cause)[:200]})" if cause is not None else ""
                raise TaskDataError(
                    f"task {self.name!r}: split {split!r} of local {self.dataset_path} files {files}: "
                    f"{type(exc).__name__}: {exc}{because}"
                ) from None
        else:
            if kwargs:
                log.warning(
                    "task %r: dataset_kwargs %s ignored: data comes from the local data root",
                    self.name,
                    sorted(kwargs),
                )
            loaded = load_split(
                self.dataset_path, self.dataset_name, split, data_root=data_root, task=self.name
            )
        process = self._function("process_docs")
        if process is not None:
            if not callable(process):
                raise ConfigError(
                    f"task {self.name!r}: process_docs: expected `!function module.name`, found {shown(process)}"
                )
            loaded = process(in_memory(loaded))
        return loaded

    def _local_files(self, files: Any) -> Any:
        """`data_files` with relative paths taken from the YAML file's folder (else the working directory)."""

        def fix(p: str) -> str:
            here = self.source.parent / p
            return str(here) if not Path(p).is_absolute() and here.exists() else p

        if isinstance(files, str):
            return fix(files)
        if isinstance(files, Mapping):
            return {k: fix(v) if isinstance(v, str) else [fix(x) for x in v] for k, v in files.items()}
        return [fix(x) for x in files]

    def rows(self, subset: str | None, split: str, data_root: str | Path | None) -> Any:
        rows = self._load_split(split, data_root)
        if split == self.split:
            self._features = set(getattr(rows, "column_names", None) or (rows[0].keys() if len(rows) else ()))
        return rows
