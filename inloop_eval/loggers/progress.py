"""What `evaluate` and the demo show while they run: an evaluation's progress, built on the `progress=` callable
that `InLoopEvaluator.run` takes (`EvaluationProgress`), and the demo's training line with its ETA
(`TrainingProgress`).

Each evaluator, before it scores, says how many requests (or sequences) this rank will score
(`Evaluator.start_progress` calls `start(title, total)`); every batch scored then calls the display with
its count. On a terminal that is one tqdm bar per evaluator with its total, percentage, rate and ETA; in a log
(stderr not a terminal) one plain line per evaluator when it ends, never a bar; on ranks other than 0 nothing.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable
from typing import TextIO

from tqdm import tqdm

log = logging.getLogger("inloop_eval")


class EvaluationProgress:
    """Progress of one evaluation (every evaluator of a config, in order), passed as `progress=`.

    n_evaluators: how many evaluators the run has (shown as `[2/5]`).
    enabled: False on ranks other than 0: the display shows nothing.
    bar: a tqdm bar (True) or log lines (False); None: a bar when `stream` is a terminal.
    lines: a line as each evaluator ends (False: the caller prints its own line per evaluation).
    """

    def __init__(
        self,
        n_evaluators: int,
        *,
        enabled: bool = True,
        bar: bool | None = None,
        lines: bool = True,
        stream: TextIO | None = None,
    ) -> None:
        self.n_evaluators = n_evaluators
        self.lines = lines
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.use_bar = bar if bar is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        self.index = 0
        self.title = ""
        self.total = 0
        self.done = 0
        self.started = 0.0
        self._bar: tqdm | None = None

    def start(self, title: str, total: int) -> None:
        """The next evaluator, `title`, is about to score `total` requests on this rank."""
        self._finish()
        self.index += 1
        self.title, self.total, self.done = title, total, 0
        self.started = time.perf_counter()
        if self.enabled and self.use_bar:
            self._bar = tqdm(
                total=total,
                desc=f"[{self.index}/{self.n_evaluators}] {title}",
                unit="req",
                file=self.stream,
                dynamic_ncols=True,
                leave=False,
            )

    def __call__(self, n: int) -> None:
        """`n` more requests scored."""
        self.done += n
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        """The evaluation is over: end the last evaluator's bar or line."""
        self._finish()

    def _finish(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.enabled and self.lines and self.title:
            line = finished_line(
                self.index, self.n_evaluators, self.title, self.done, time.perf_counter() - self.started
            )
            if self.use_bar:
                print(line, file=self.stream, flush=True)
            else:
                log.info("%s", line)
        self.title = ""


def finished_line(index: int, n_evaluators: int, title: str, done: int, seconds: float) -> str:
    """One evaluator's line, e.g. `[2/5] task 'piqa': 160 requests in 3.2 s (50 req/s)`."""
    rate = f" ({done / seconds:.0f} req/s)" if seconds > 0 and done else ""
    return f"[{index}/{n_evaluators}] {title}: {done} requests in {seconds:.1f} s{rate}"


class TrainingProgress:
    """The training loop's line every few steps, `step  20/150  train loss 3.456  (4.1 steps/s, ETA 00:42)`,
    and the step part of each evaluation's line.

    The ETA is the training steps left at the rate seen so far (evaluations not counted) plus the evaluations
    left, each at the mean time of those done so far (none counted before the first has run).

    steps: the last training step (steps 0 .. steps - 1 train; evaluations may run at 0 .. steps).
    eval_steps: the steps at which an evaluation runs.
    clock: seconds, monotonic (a test passes its own).
    """

    def __init__(
        self, steps: int, eval_steps: Iterable[int], *, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.steps = steps
        self.eval_steps = sorted(set(eval_steps))
        self.clock = clock
        self.started = clock()
        self.eval_seconds = 0.0
        self.evaluations = 0

    def evaluated(self, seconds: float) -> None:
        """An evaluation took `seconds` (its `eval/seconds`): left out of the training rate, counted in the ETA."""
        self.eval_seconds += seconds
        self.evaluations += 1

    def step_text(self, step: int) -> str:
        """`step  20/150`, the step right-aligned to the total's width."""
        return f"step {step:>{len(str(self.steps))}d}/{self.steps}"

    def line(self, step: int, loss: float) -> str:
        """The line after training step `step` (0-based), its loss `loss`."""
        done = step + 1
        train_seconds = max(self.clock() - self.started - self.eval_seconds, 0.0)
        rate = done / train_seconds if train_seconds > 0 else 0.0
        return f"{self.step_text(step)}  train loss {loss:.3f}  ({rate:.1f} steps/s, ETA {self.eta(step, rate)})"

    def eta(self, step: int, rate: float) -> str:
        """The time left after training step `step` at `rate` steps per second, as tqdm shows it (`01:23`)."""
        if rate <= 0:
            return "?"
        evaluations_left = sum(s > step for s in self.eval_steps)
        mean_eval = self.eval_seconds / self.evaluations if self.evaluations else 0.0
        seconds = (self.steps - step - 1) / rate + evaluations_left * mean_eval
        return tqdm.format_interval(seconds)
