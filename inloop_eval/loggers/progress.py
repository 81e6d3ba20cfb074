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
    clock: seconds, monotonic (a test passes its own).

    `scoring_seconds` (read after `close`): from each evaluator's start to its last batch scored, summed: the
    evaluation without what it does before scoring (loading and tokenizing documents, once per process).
    """

    def __init__(
        self,
        n_evaluators: int,
        *,
        enabled: bool = True,
        bar: bool | None = None,
        lines: bool = True,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.n_evaluators = n_evaluators
        self.clock = clock
        self.lines = lines
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.use_bar = bar if bar is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        self.index = 0
        self.title = ""
        self.total = 0
        self.done = 0
        self.started = 0.0
        self.last_scored = 0.0
        self.scoring_seconds = 0.0
        self._bar: tqdm | None = None

    def start(self, title: str, total: int) -> None:
        """The next evaluator, `title`, is about to score `total` requests on this rank."""
        self._finish()
        self.index += 1
        self.title, self.total, self.done = title, total, 0
        self.started = self.last_scored = self.clock()
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
        self.last_scored = self.clock()
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        """The evaluation is over: end the last evaluator's bar or line."""
        self._finish()

    def _finish(self) -> None:
        if self.title:
            self.scoring_seconds += self.last_scored - self.started
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.enabled and self.lines and self.title:
            line = finished_line(
                self.index, self.n_evaluators, self.title, self.done, self.clock() - self.started
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

    The ETA is the training steps left at the steady rate plus the evaluations left at the steady cost of
    one, each leaving out the one-off work at the start that the rest will not repeat:
    - the rate: steps per second of training since the first line (evaluations not counted): the first
      steps carry one-off costs (the first forward and backward, the optimizer's state), so the first line
      shows the rate since the start and `ETA ?`;
    - an evaluation: the mean of those after the first; while only the first has run, its scoring time
      (`EvaluationProgress.scoring_seconds`) when given, since the first also loads and tokenizes every
      task's documents, which the later ones reuse. None counted before the first has run.

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
        self.evaluations: list[float] = []
        self.first_scoring: float | None = None
        self.first_line: tuple[int, float, float] | None = None  # (steps done, clock, eval seconds) then

    def evaluated(self, seconds: float, scoring_seconds: float | None = None) -> None:
        """An evaluation took `seconds` (its `eval/seconds`): left out of the training rate, counted in the ETA.
        scoring_seconds: of those, the time spent scoring (`EvaluationProgress.scoring_seconds`), which
        estimates the later evaluations while only the first has run."""
        self.eval_seconds += seconds
        if not self.evaluations and scoring_seconds is not None:
            self.first_scoring = min(scoring_seconds, seconds)
        self.evaluations.append(seconds)

    def step_text(self, step: int) -> str:
        """`step  20/150`, the step right-aligned to the total's width."""
        return f"step {step:>{len(str(self.steps))}d}/{self.steps}"

    def line(self, step: int, loss: float) -> str:
        """The line after training step `step` (0-based), its loss `loss`; its ETA is `?` at the first line."""
        done, now = step + 1, self.clock()
        if self.first_line is None:
            self.first_line = (done, now, self.eval_seconds)
        first_done, first_time, first_eval = self.first_line
        if done > first_done:  # the steady rate: since the first line, whose steps carry the one-off costs
            rate = steps_per_second(done - first_done, now - first_time - (self.eval_seconds - first_eval))
            eta = self.eta(step, rate)
        else:  # the first line: the rate since the start, too early for an ETA
            rate, eta = steps_per_second(done, now - self.started - self.eval_seconds), "?"
        return f"{self.step_text(step)}  train loss {loss:.3f}  ({rate:.1f} steps/s, ETA {eta})"

    def evaluation_seconds(self) -> float:
        """What one more evaluation is expected to take (see the class docstring); 0.0 before any has run."""
        if len(self.evaluations) > 1:
            later = self.evaluations[1:]
            return sum(later) / len(later)
        if self.first_scoring is not None:
            return self.first_scoring
        return self.evaluations[0] if self.evaluations else 0.0

    def eta(self, step: int, rate: float) -> str:
        """The time left after training step `step` at `rate` steps per second, as tqdm shows it (`01:23`)."""
        if rate <= 0:
            return "?"
        evaluations_left = sum(s > step for s in self.eval_steps)
        seconds = (self.steps - step - 1) / rate + evaluations_left * self.evaluation_seconds()
        return tqdm.format_interval(seconds)


def steps_per_second(steps: int, seconds: float) -> float:
    """`steps / seconds`, 0.0 before any time has passed."""
    return steps / seconds if seconds > 0 else 0.0
