"""Reading lm-evaluation-harness YAML task files: `include:` merging and `!function` references.

Safety: a `!function` reference runs only from a `.py` file inside the folder the user named (the
`trusted_root`); each such file is imported once (by resolved path).
"""

from __future__ import annotations

import importlib.util
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from inloop_eval.errors import ConfigError

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
