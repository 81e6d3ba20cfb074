"""lm-evaluation-harness YAML tasks with `output_type: multiple_choice`, rendered as the harness renders them.

Supported keys: `task`, `include` (one file or a list; the including file wins, then earlier includes over
later ones), `group` / `tag` (the task's groups), group files (`group: name` with `task: [members]`),
`dataset_path` / `dataset_name` / `dataset_kwargs` (a hub path reads the local data root in OLMo's layout;
`json`, `csv`, `parquet` and `arrow` read local `data_files`, relative to the YAML file), `test_split` /
`validation_split` (the evaluated split, test first, as the harness does) / `training_split` /
`fewshot_split`, `process_docs`, `doc_to_text`, `doc_to_choice`, `doc_to_target` (a field name, a Jinja
template, a list, or `!function module.name`), `description` (a template), `target_delimiter`,
`fewshot_delimiter`, `num_fewshot`, `fewshot_config.sampler` (`first_n`; otherwise this package's per-document
seeded sampling, not the harness's sequence-dependent one), `metric_list`.

Safety: loading a task never runs code from a dataset repository (no hub loading, `trust_remote_code` is
dropped), and `!function` references run only from `.py` files inside the folder the user named (the
`trusted_root`); templates render in Jinja's sandbox.
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import datasets
import yaml
from datasets.table import InMemoryTable
from jinja2 import BaseLoader, StrictUndefined
from jinja2.sandbox import SandboxedEnvironment

from inloop_eval.data_root import load_split
from inloop_eval.errors import ConfigError, TaskDataError, UnknownTaskError
from inloop_eval.tasks.base import MultipleChoiceTask, shown
from inloop_eval.tasks.registry import register, register_resolver

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
LOCAL_BUILDERS: frozenset[str] = frozenset({"json", "csv", "parquet", "arrow"})


# Task folders' Python files, imported once each (by resolved path).
_MODULES: dict[Path, ModuleType] = {}


@dataclass(frozen=True)
class FunctionRef:
    """`!function utils.process_docs` in a YAML file: resolved only from inside a trusted folder."""

    name: str
    yaml_dir: Path

    def resolve(self, trusted_root: Path, task: str) -> Callable[..., Any]:
        *module_parts, function = self.name.split(".")
        if not module_parts or not function:
            raise ConfigError(f"task {task!r}: !function {self.name!r}: expected module.function")
        module_path = (self.yaml_dir / ("/".join(module_parts) + ".py")).resolve()
        root = trusted_root.resolve()
        if not module_path.is_relative_to(root):
            raise ConfigError(
                f"task {task!r}: !function {self.name!r} would run {module_path}, outside the task folder {root} "
                "that was named; functions run only from the folder you name"
            )
        if not module_path.is_file():
            raise ConfigError(
                f"task {task!r}: !function {self.name!r}: expected the file {module_path}, found none"
            )
        module = _MODULES.get(module_path)
        if module is None:
            key = f"inloop_eval_harness_{zlib.crc32(str(module_path).encode())}_{module_path.stem}"
            spec = importlib.util.spec_from_file_location(key, module_path)
            if spec is None or spec.loader is None:
                raise ConfigError(f"task {task!r}: !function {self.name!r}: cannot import {module_path}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            _MODULES[module_path] = module
        fn = getattr(module, function, None)
        if not callable(fn):
            raise ConfigError(
                f"task {task!r}: !function {self.name!r}: {module_path} has no function {function!r}"
            )
        return fn


def _loader_for(path: Path) -> type[yaml.SafeLoader]:
    class Loader(yaml.SafeLoader):
        pass

    def function(loader: yaml.SafeLoader, node: yaml.Node) -> FunctionRef:
        return FunctionRef(str(loader.construct_scalar(node)), path.parent)  # type: ignore[arg-type]

    Loader.add_constructor("!function", function)
    return Loader


def load_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A YAML task file with its `include:`s merged (as the harness's `load_yaml_config` does)."""
    path = Path(path).resolve()
    if path in _seen:
        raise ConfigError(
            f"harness YAML {path}: `include:` loops back to itself ({' -> '.join(map(str, _seen))})"
        )
    try:
        config = yaml.load(path.read_text(), Loader=_loader_for(path))  # noqa: S506 (a SafeLoader subclass)
    except FileNotFoundError:
        raise ConfigError(f"harness YAML {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"harness YAML {path}: not valid YAML ({exc})") from None
    if not isinstance(config, dict):
        raise ConfigError(
            f"harness YAML {path}: expected a mapping at the top, found {type(config).__name__}"
        )
    includes = config.pop("include", None)
    if includes is None:
        return config
    merged: dict[str, Any] = {}
    for include in reversed([includes] if isinstance(includes, str) else list(includes)):
        target = Path(include) if Path(include).is_absolute() else path.parent / include
        merged.update(load_yaml(target, (*_seen, path)))
    merged.update(config)
    return merged


def _render_template(template: str, doc: Mapping[str, Any]) -> str:

    global _ENV
    if _ENV is None:
        _ENV = SandboxedEnvironment(
            loader=BaseLoader(), undefined=StrictUndefined, keep_trailing_newline=True
        )
        _ENV.filters["regex_replace"] = lambda s, pattern, repl, count=0: re.sub(
            pattern, repl, s, count=count
        )
    return _ENV.from_string(template).render(**doc)


_ENV: Any = None


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
            return _render_template(self.config[key], raw)
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
        return ast.literal_eval(text) if text.isdigit() else text

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
            return ast.literal_eval(text)
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
        return _render_template(description, raw) if description else ""

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
            kwargs.pop("revision", None)
            try:
                loaded = datasets.load_dataset(
                    self.dataset_path, self.dataset_name, data_files=files, split=split, **kwargs
                )
            except Exception as exc:  # datasets raises many types for missing or malformed files
                raise TaskDataError(
                    f"task {self.name!r}: split {split!r} of local {self.dataset_path} files {files}: "
                    f"{type(exc).__name__}: {exc}"
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
            loaded = process(_in_memory(loaded))
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


def _in_memory(dataset: Any) -> Any:
    """The same rows without backing files, so that `process_docs`'s `map` writes no cache files beside the
    data root's splits (or anywhere else)."""
    if not isinstance(dataset, datasets.Dataset) or not dataset.cache_files:
        return dataset
    if getattr(dataset, "_indices", None) is not None:  # a selection of rows: materialise it in memory
        return dataset.flatten_indices(keep_in_memory=True)
    return datasets.Dataset(InMemoryTable(dataset.data.table), info=dataset.info.copy(), split=dataset.split)


@dataclass
class HarnessSuite:
    """The tasks and groups of one YAML file or folder (recursively), by harness name."""

    root: Path
    configs: dict[str, tuple[dict[str, Any], Path]] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> HarnessSuite:
        path = Path(path).expanduser().resolve()
        if not path.exists():
            raise ConfigError(
                f"harness tasks: {path} does not exist; name a task YAML file or a folder of them"
            )
        suite = cls(path.parent if path.is_file() else path)
        files = [path] if path.is_file() else sorted(path.rglob("*.yaml"))
        for file in files:
            config = load_yaml(file)
            task = config.get("task")
            if isinstance(task, list):
                suite._add_group(config, file)
            elif isinstance(task, str):
                if task in suite.configs:
                    raise ConfigError(
                        f"harness task {task!r} is defined twice: {suite.configs[task][1]} and {file}"
                    )
                suite.configs[task] = (config, file)
                for tag in ("group", "tag"):
                    names = config.get(tag) or []
                    for group in [names] if isinstance(names, str) else names:
                        suite.groups.setdefault(group, []).append(task)
        return suite

    def _add_group(self, config: Mapping[str, Any], file: Path) -> None:
        group = config.get("group")
        if not isinstance(group, str):
            raise ConfigError(f"harness group file {file}: expected `group: <name>` beside `task: [...]`")
        members: list[str] = []
        for entry in config["task"]:
            if isinstance(entry, str):
                members.append(entry)
            elif isinstance(entry, Mapping) and isinstance(entry.get("task"), str):
                inline = dict(entry)
                if "include" in inline:
                    base = load_yaml(file.parent / inline.pop("include"))
                    inline = {**base, **inline}
                name = inline["task"]
                if name in self.configs and len(inline) > 1:
                    base_config, source = self.configs[name]
                    self.configs[name] = ({**base_config, **inline}, source)
                elif name not in self.configs:
                    self.configs[name] = (inline, file)
                members.append(name)
            else:
                raise ConfigError(
                    f"harness group {group!r} ({file}): expected task names or mappings, found {shown(entry)}"
                )
        self.groups[group] = members

    def names(self) -> list[str]:
        return sorted(self.configs)

    def expand(self, name: str) -> list[str]:
        """A task name as itself; a group as its member tasks, nested groups expanded, in order."""
        if name in self.configs:
            return [name]
        if name not in self.groups:
            raise UnknownTaskError(
                f"harness tasks in {self.root}: no task or group {name!r}; tasks: {self.names()}"
            )
        out: list[str] = []
        for member in self.groups[name]:
            if member == name:
                continue
            out += [m for m in self.expand(member) if m not in out]
        return out

    def task(self, name: str) -> HarnessYamlTask:
        if name not in self.configs:
            raise UnknownTaskError(f"harness tasks in {self.root}: no task {name!r}; tasks: {self.names()}")
        config, source = self.configs[name]
        return HarnessYamlTask(config, source, self.root)


def register_harness_tasks(path: str | Path, *, prefix: str = "", replace: bool = False) -> list[str]:
    """Register every task of a YAML file or folder as `<prefix><task name>` (lower-cased); returns the ids.

    Functions (`!function`) of these tasks run only from `.py` files inside `path` (its folder, for a file).
    """
    suite = HarnessSuite.load(path)
    ids = []
    for name in suite.names():
        task_id = f"{prefix}{name}".lower()
        register(task_id, lambda name=name: suite.task(name), replace=replace)
        ids.append(task_id)
    return ids


def _resolve(rest: str) -> MultipleChoiceTask:
    """`harness:<file.yaml>` (its one task) or `harness:<file or folder>#<task>`."""
    path, _, name = rest.partition("#")
    suite = HarnessSuite.load(path)
    if not name:
        if len(suite.configs) != 1:
            raise UnknownTaskError(
                f"unknown task 'harness:{rest}': {path} defines {len(suite.configs)} tasks; "
                f"name one as harness:{path}#<task> ({suite.names()})"
            )
        name = suite.names()[0]
    return suite.task(name)


register_resolver("harness", _resolve)
