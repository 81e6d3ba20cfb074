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
`trusted_root`); templates render in Jinja's sandbox with the work of each rendering bounded
(`BoundedSandbox`), and `dataset_kwargs.cache_dir` is ignored, so a YAML file does not choose where files are
written. Local data files are checked before loading (a folder, an empty file, bytes that are not UTF-8 are
errors naming the file and line).
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import math
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
from jinja2 import BaseLoader, StrictUndefined, Template
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context
from jinja2.sandbox import SandboxedEnvironment

from inloop_eval.data.root import load_split
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
        root = trusted_root.resolve()
        module_name, _, function = self.name.rpartition(".")
        if re.search(r"[/\\]", module_name):  # a path, which the harness also takes: the file it names
            module_path = (self.yaml_dir / (module_name + ".py")).resolve()
        else:
            module_parts = module_name.split(".")
            if not all(module_parts):
                raise ConfigError(
                    f"task {task!r}: !function {self.name!r}: expected a dotted name module.function, as "
                    "`!function utils.process_docs`"
                )
            module_path = (self.yaml_dir / ("/".join(module_parts) + ".py")).resolve()
        if not function:
            raise ConfigError(
                f"task {task!r}: !function {self.name!r}: expected module.function, as `!function utils.process_docs`"
            )
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
    except IsADirectoryError:
        via = f" (named by `include:` in {_seen[-1]})" if _seen else ""
        raise ConfigError(
            f"harness YAML {path}{via} is a folder; expected a YAML file, e.g. {path / 'task.yaml'}"
        ) from None
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


# What one rendering may do. The sandbox bounds attribute access, not work: these bound the work a YAML
# file can ask for (a power with a huge result, a huge repetition, endless loops over `range`).
MAX_TEMPLATE_OPS = 1_000_000  # calls, attribute and item lookups, operators and range items per rendering
MAX_POWER_BITS = 4096  # `a ** b` on integers: refused when the result would need more bits
MAX_REPEAT_LENGTH = 1_000_000  # `s * n` on a string or list: refused when the result would be longer


class TemplateBudgetError(SecurityError):
    """A template asked for more work than one rendering may do."""


class BoundedSandbox(SandboxedEnvironment):
    """Jinja's sandbox with the work of each rendering bounded: every call, lookup, `**`, `*` and range
    item counts against `MAX_TEMPLATE_OPS`, and powers and repetitions with huge results are refused
    before they are computed. (A loop whose body does none of these counts only through its iterable.)"""

    intercepted_binops = frozenset({"**", "*"})

    def __init__(self) -> None:
        super().__init__(loader=BaseLoader(), undefined=StrictUndefined, keep_trailing_newline=True)
        self.ops_left = MAX_TEMPLATE_OPS
        self.compiled: dict[str, Template] = {}
        self.globals["range"] = self.bounded_range
        self.filters["regex_replace"] = lambda s, pattern, repl, count=0: re.sub(
            pattern, repl, s, count=count
        )

    def render(self, template: str, doc: Mapping[str, Any]) -> str:
        """`template` rendered with the fields of `doc`, within a fresh budget."""
        self.ops_left = MAX_TEMPLATE_OPS
        if template not in self.compiled:  # operators are intercepted, so compiling folds no constant
            self.compiled[template] = self.from_string(template)
        return self.compiled[template].render(**doc)

    def spend(self, n: int = 1) -> None:
        self.ops_left -= n
        if self.ops_left < 0:
            raise TemplateBudgetError(
                f"the template does more than {MAX_TEMPLATE_OPS} operations in one rendering"
            )

    def bounded_range(self, *args: int) -> range:
        items = range(*args)
        self.spend(len(items))
        return items

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        self.spend()
        if operator == "**" and _int(left) and _int(right) and right > 0 and abs(left) > 1:
            bits = math.inf if right.bit_length() > 256 else right * math.log2(abs(left))
            if bits > MAX_POWER_BITS:
                raise TemplateBudgetError(
                    f"{left} ** {right} would have about {bits:.3g} bits; at most {MAX_POWER_BITS} are allowed"
                )
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and _int(n) and len(seq) * n > MAX_REPEAT_LENGTH:
                    raise TemplateBudgetError(
                        f"repeating a {type(seq).__name__} of length {len(seq)} {n} times is longer than "
                        f"{MAX_REPEAT_LENGTH}"
                    )
        return super().call_binop(context, operator, left, right)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.spend()
        return super().call(context, obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:
        self.spend()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.spend()
        return super().getitem(obj, argument)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_ENV: BoundedSandbox | None = None


def _render_template(template: str, doc: Mapping[str, Any]) -> str:
    """A harness template rendered in the bounded sandbox (one environment per process, each template
    compiled once)."""
    global _ENV
    if _ENV is None:
        _ENV = BoundedSandbox()
    return _ENV.render(template, doc)


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
        if not description:
            return ""
        try:
            return _render_template(description, raw)
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


def check_local_files(task: str, builder: str, files: Any) -> None:
    """Each named local data file exists as a file, is not empty, and (JSON, CSV) is UTF-8 text: an
    error naming the file and line, which the datasets library would give only as a bare exception
    (or, for invalid UTF-8, only when the row is read). Patterns (`*`) are left to the library."""
    if isinstance(files, Mapping):
        named = [f for v in files.values() for f in ([v] if isinstance(v, str) else v)]
    else:
        named = [files] if isinstance(files, str) else list(files)
    for name in named:
        path = Path(name)
        if any(c in name for c in "*?[") or "://" in name or not path.exists():
            continue  # globs, URLs and missing files: the library's own error names them
        if path.is_dir():
            raise TaskDataError(
                f"task {task!r}: data file {path} is a folder; expected a {builder} file, "
                f"or a pattern such as {path / '*'}"
            )
        blank = path.stat().st_size == 0 or (builder in ("json", "csv") and not check_utf8(task, path))
        if blank:
            raise TaskDataError(
                f"task {task!r}: data file {path} is empty; expected {builder} rows (write them, or "
                "leave the file out of data_files)"
            )


def check_utf8(task: str, path: Path) -> bool:
    """Whether a text data file has a line with more than whitespace; raises naming the file, line and
    byte when it does not decode as UTF-8."""
    nonblank = False
    with path.open("rb") as f:
        for line_no, line in enumerate(f, start=1):
            try:
                nonblank = bool(line.decode("utf-8").strip()) or nonblank
            except UnicodeDecodeError as exc:
                raise TaskDataError(
                    f"task {task!r}: data file {path} line {line_no}: not UTF-8 (byte {line[exc.start]:#04x} "
                    f"at column {exc.start + 1}); re-encode the file as UTF-8"
                ) from None
    return nonblank


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
        if not files:
            raise ConfigError(
                f"harness tasks: the folder {path} holds no .yaml files; name a task YAML file or a folder of them"
            )
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
