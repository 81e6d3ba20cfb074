"""Reading lm-evaluation-harness YAML task files: `include:` merging and `!function` references.

Safety: files are read, and `!function` references run, only from inside the folder the user named (the
`trusted_root`, symbolic links resolved): an `include:` elsewhere is refused naming the file, before it is
opened, and so is one that is not a regular file (a named pipe, a device) or is larger than `MAX_YAML_BYTES`;
a parse error names the line and column, never the file's text. A `!function` runs from a `.py` file, each
imported once (by resolved path).
"""

from __future__ import annotations

import importlib.util
import os
import re
import stat
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from inloop_eval.errors import ConfigError
from inloop_eval.tasks.harness.bounds import weigh

MAX_YAML_BYTES = 1 << 20  # one task file (harness task files are a few kilobytes)
MAX_YAML_WEIGHT = 4 * MAX_YAML_BYTES  # characters and items of a file's data once its aliases are expanded
MAX_INCLUDED_FILES = 64  # files read for one task file, its includes (and theirs) counted

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


def load_yaml(
    path: str | Path,
    trusted_root: str | Path | None = None,
    *,
    _reads: list[Path] | None = None,
    _seen: tuple[Path, ...] = (),
) -> dict[str, Any]:
    """A YAML task file with its `include:`s merged (as the harness's `load_yaml_config` does).

    trusted_root: the folder the user named (default: the file's own folder); an `include:` is read only
        from inside it, and only when it is a regular file of at most `MAX_YAML_BYTES`.
    """
    path = Path(path).resolve()
    root = path.parent if trusted_root is None else Path(trusted_root).resolve()
    reads = [] if _reads is None else _reads
    via = f" (named by `include:` in {_seen[-1]})" if _seen else ""
    if path in _seen:
        raise ConfigError(
            f"harness YAML {path}: `include:` loops back to itself ({' -> '.join(map(str, _seen))})"
        )
    if not path.is_relative_to(root):
        raise ConfigError(
            f"harness YAML {path}{via} is outside the task folder {root} that was named; files are read only "
            "from the folder you name (name a folder that holds both, as harness:<folder>#<task>)"
        )
    reads.append(path)
    if len(reads) > MAX_INCLUDED_FILES:
        raise ConfigError(
            f"harness YAML {reads[0]}: its `include:`s read more than {MAX_INCLUDED_FILES} files; "
            "include each base file once"
        )
    try:
        config = yaml.load(_read(path, via), Loader=_loader_for(path))  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        raise ConfigError(f"harness YAML {path}{via}: not valid YAML ({_yaml_problem(exc)})") from None
    if not isinstance(config, dict):
        raise ConfigError(
            f"harness YAML {path}: expected a mapping at the top, found {type(config).__name__}"
        )
    if weigh(config, MAX_YAML_WEIGHT)[0] > MAX_YAML_WEIGHT:  # aliases can repeat a list within a list...
        raise ConfigError(
            f"harness YAML {path}{via}: its aliases expand to more than {MAX_YAML_WEIGHT} characters and items"
        )
    includes = config.pop("include", None)
    if includes is None:
        return config
    merged: dict[str, Any] = {}
    for include in reversed([includes] if isinstance(includes, str) else list(includes)):
        if not isinstance(include, str):
            raise ConfigError(f"harness YAML {path}: `include:` expected file names, found {include!r}")
        target = Path(include) if Path(include).is_absolute() else path.parent / include
        merged.update(load_yaml(target, root, _reads=reads, _seen=(*_seen, path)))
    merged.update(config)
    return merged


def _read(path: Path, via: str) -> bytes:
    """The bytes of a regular file of at most `MAX_YAML_BYTES`, its kind checked before it is opened (opening
    a named pipe would block; a device such as /dev/zero never ends)."""
    try:
        _refuse_special(path, via, os.stat(path).st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            _refuse_special(path, via, os.fstat(fd).st_mode)  # what was opened, should the path have changed
            chunks: list[bytes] = []
            while chunk := os.read(fd, MAX_YAML_BYTES + 1):
                chunks.append(chunk)
                if sum(map(len, chunks)) > MAX_YAML_BYTES:
                    raise ConfigError(
                        f"harness YAML {path}{via} is larger than {MAX_YAML_BYTES} bytes, the most a task "
                        "file may have"
                    )
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise ConfigError(f"harness YAML {path}{via} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"harness YAML {path}{via} cannot be read ({exc.strerror})") from None
    return b"".join(chunks)


def _refuse_special(path: Path, via: str, mode: int) -> None:
    """Raise unless `mode` is a regular file's."""
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise ConfigError(
            f"harness YAML {path}{via} is a folder; expected a YAML file, e.g. {path / 'task.yaml'}"
        )
    if stat.S_ISFIFO(mode):
        kind = "a named pipe (FIFO)"
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        kind = "a device"
    else:
        kind = "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
    raise ConfigError(f"harness YAML {path}{via} is {kind}, not a regular file; expected a YAML file")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and what the parse error is, without the file's text (which may hold secrets)."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return str(exc).splitlines()[0][:200]
    mark = exc.problem_mark or exc.context_mark
    where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
    what = "; ".join(p for p in (exc.context, exc.problem) if p) or type(exc).__name__
    return where + what[:200]
