"""The logger interface, its no-op default, `MultiLogger`, and what every logger shares: rank-0 only, failures
warned about once and never raised into training.

Every logger takes the evaluator's plain `{key: float}` dict with the trainer's step, `log(metrics, step)`,
and records the whole configuration once with `log_config(config)`. Only rank 0 writes; on other ranks the
loggers do nothing. Logging never stops training: a logger's `log`, `log_config` and `finish` catch their own
failures (a full disk, a W&B error), warn once per kind of failure and return.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

from inloop_eval.distributed import world
from inloop_eval.errors import InLoopEvalError
from inloop_eval.metrics.icl import DocumentOutcomes

log = logging.getLogger(__name__)

# Curves drawn together per task, by the W&B chart and by the report: the acc vs acc_norm view.
CURVE_METRICS: tuple[str, ...] = ("acc", "acc_norm", "acc_pmi")


class LoggerError(InLoopEvalError):
    """A logger that cannot start (its run directory cannot be created or its file opened)."""


class WarnOnce:
    """Warns the first time each kind of failure happens: a full disk warns once, not at every step."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, kind: str, message: str) -> None:
        if kind not in self.seen:
            self.seen.add(kind)
            log.warning("%s (shown once)", message)


def error_kind(exc: BaseException) -> str:
    """`ENOSPC`, `EIO`, ... for an OSError, else the exception's type name."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return type(exc).__name__


def is_rank_zero() -> bool:
    """True on the process that logs: rank 0 of the process group, else of `torchrun`'s `RANK`."""
    world_size, rank = world()
    if world_size > 1:
        return rank == 0
    return int(os.environ.get("RANK", "0")) == 0


def as_dict(config: Any) -> dict[str, Any]:
    """A config dataclass (or mapping) as a plain nested dict, for JSON and W&B."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return dict(config or {})


class MetricsLogger:
    """The logger interface; this base class is the no-op default."""

    def log_config(self, config: Any) -> None:
        """Record the whole configuration (a dataclass or a mapping)."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record `metrics` at the trainer's `step`."""

    def log_outcomes(self, outcomes: Mapping[str, DocumentOutcomes], step: int) -> None:
        """Record each task's per-document outcomes (label -> `DocumentOutcomes`) at `step`; loggers without a
        run directory ignore them."""

    def finish(self) -> None:
        """Flush and close."""

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.finish()


class NullLogger(MetricsLogger):
    """Logs nothing."""


class MultiLogger(MetricsLogger):
    """Hands every call to each of several loggers, in order; one that fails does not keep the call from the
    others (nor from the training loop)."""

    def __init__(self, loggers: Iterable[MetricsLogger]) -> None:
        self.loggers = list(loggers)
        self._warn = WarnOnce()

    def log_config(self, config: Any) -> None:
        for logger in self.loggers:
            self._call(logger, "log_config", config)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for logger in self.loggers:
            self._call(logger, "log", metrics, step)

    def log_outcomes(self, outcomes: Mapping[str, DocumentOutcomes], step: int) -> None:
        for logger in self.loggers:
            self._call(logger, "log_outcomes", outcomes, step)

    def finish(self) -> None:
        for logger in self.loggers:
            self._call(logger, "finish")

    def _call(self, logger: MetricsLogger, method: str, *args: Any) -> None:
        # Our loggers catch their own failures; this catches those of a logger written elsewhere.
        try:
            getattr(logger, method)(*args)
        except Exception as exc:
            name = type(logger).__name__
            self._warn(
                f"{name}.{method}:{error_kind(exc)}",
                f"MultiLogger: {name}.{method} failed ({type(exc).__name__}: {exc}); the other loggers and "
                "training go on without it for this call",
            )
