"""The task registry: task id -> factory. Families register themselves on import of `inloop_eval.tasks`.

Besides the registered ids, `get_task` understands
- `<id>_<k>shot`: the registered task with k few-shot examples (`arc_easy_rc_5shot`, `mmlu_stem_mc_5shot`);
- `<prefix>:<rest>` for a registered resolver (`oe_eval:arc_easy:rc_5shot`, `harness:path/to/task.yaml`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable

from inloop_eval.errors import UnknownTaskError
from inloop_eval.tasks.base import MultipleChoiceTask

_FACTORIES: dict[str, Callable[[], MultipleChoiceTask]] = {}
_RESOLVERS: dict[str, Callable[[str], MultipleChoiceTask]] = {}
# Prefixes whose resolver reads files (`harness:`): their ids are checked when the task is loaded, where a
# missing file is a data failure agreed across ranks, not when the evaluator is built.
_READS_FILES: set[str] = set()
_SHOTS = re.compile(r"^(?P<base>.+)_(?P<k>\d+)shot$")


def register(name: str, factory: Callable[[], MultipleChoiceTask], *, replace: bool = False) -> None:
    """Add a task id; ids are lower-case without spaces and unique (unless `replace`)."""
    if name != name.lower() or " " in name or ":" in name:
        raise ValueError(f"task id {name!r}: expected lower-case without spaces or ':'")
    if name in _FACTORIES and not replace:
        raise ValueError(f"task id {name!r} is registered twice")
    _FACTORIES[name] = factory


def register_resolver(
    prefix: str, resolve: Callable[[str], MultipleChoiceTask], *, reads_files: bool = False
) -> None:
    """Ids `<prefix>:<rest>` are built by `resolve(rest)` (tasks defined by files rather than code);
    `reads_files`: resolving opens files, so `check_task_id` leaves the rest to loading."""
    if prefix in _RESOLVERS:
        raise ValueError(f"task id prefix {prefix!r} is registered twice")
    _RESOLVERS[prefix] = resolve
    if reads_files:
        _READS_FILES.add(prefix)


def check_task_id(name: str) -> None:
    """UnknownTaskError (naming the closest ids) unless `name` is a task id the registry can build. Reads
    no file, so it gives the same answer on every rank: ids of a resolver that reads files (`harness:`) are
    only checked for their prefix here."""
    prefix, colon, _ = name.partition(":")
    if colon and prefix in _READS_FILES:
        return
    get_task(name)


def get_task(name: str) -> MultipleChoiceTask:
    """A fresh task instance; UnknownTaskError lists the closest ids."""
    if name in _FACTORIES:
        task = _FACTORIES[name]()
    elif ":" in name and name.split(":", 1)[0] in _RESOLVERS:
        prefix, rest = name.split(":", 1)
        task = _RESOLVERS[prefix](rest)
    elif (match := _SHOTS.match(name)) and match["base"] in _FACTORIES:
        task = _FACTORIES[match["base"]]()
        if not task.supports_fewshot:
            raise UnknownTaskError(f"unknown task {name!r}: task {match['base']!r} takes no shot count")
        task.num_fewshot = int(match["k"])
    else:
        close = difflib.get_close_matches(name, _FACTORIES, n=5)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `inloop-eval tasks` lists them"
        raise UnknownTaskError(f"unknown task {name!r}{hint}") from None
    task.name = name
    return task


def data_splits() -> list[tuple[str, str | None, str]]:
    """(dataset path, subset, split) of every split the registered tasks read from the data root: the
    evaluated split and the few-shot split of each subset, in registration order, without repeats."""
    out: dict[tuple[str, str | None, str], None] = {}
    for factory in _FACTORIES.values():
        task = factory()
        if not task.dataset_path:
            continue  # documents from files of its own (oe-eval requests), not a dataset split
        for subset in task.subsets():
            for split in (task.split, task.fewshot_split):
                if split is not None:
                    out.setdefault((task.dataset_path, subset, split), None)
    return list(out)


def task_names() -> list[str]:
    """The registered ids (each also takes a `_<k>shot` suffix)."""
    return sorted(_FACTORIES)
