"""The task registry: task id -> factory. Families register themselves on import of `inloop_eval.tasks`."""

from __future__ import annotations

import difflib
from collections.abc import Callable

from inloop_eval.errors import UnknownTaskError
from inloop_eval.tasks.base import MultipleChoiceTask

_FACTORIES: dict[str, Callable[[], MultipleChoiceTask]] = {}


def register(name: str, factory: Callable[[], MultipleChoiceTask]) -> None:
    """Add a task id; ids are lower-case without spaces and unique."""
    if name != name.lower() or " " in name:
        raise ValueError(f"task id {name!r}: expected lower-case without spaces")
    if name in _FACTORIES:
        raise ValueError(f"task id {name!r} is registered twice")
    _FACTORIES[name] = factory


def get_task(name: str) -> MultipleChoiceTask:
    """A fresh task instance; UnknownTaskError lists the closest ids."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        close = difflib.get_close_matches(name, _FACTORIES, n=5)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `inloop-eval tasks` lists them"
        raise UnknownTaskError(f"unknown task {name!r}{hint}") from None
    task = factory()
    task.name = name
    return task


def task_names() -> list[str]:
    return sorted(_FACTORIES)
