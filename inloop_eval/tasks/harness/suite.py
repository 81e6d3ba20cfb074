"""Suites of harness tasks (a YAML file or a folder of them, with groups) and their task ids: the `harness:`
resolver (`harness:<file.yaml>`, `harness:<file or folder>#<task>`) and `register_harness_tasks`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inloop_eval.errors import ConfigError, UnknownTaskError
from inloop_eval.tasks.base import MultipleChoiceTask, shown
from inloop_eval.tasks.harness.loader import load_yaml
from inloop_eval.tasks.harness.task import HarnessYamlTask
from inloop_eval.tasks.registry import register, register_resolver


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
            config = load_yaml(file, suite.root)
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
                    base = load_yaml(file.parent / str(inline.pop("include")), self.root)
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


register_resolver("harness", _resolve, reads_files=True)
