"""What a run shows while it goes: an evaluation's bar per task with its total on a terminal, one line per
task in a log, nothing off rank 0; the demo's training line with the step, its total and the time left."""

from __future__ import annotations

import io
import logging

from inloop_eval.loggers.progress import EvaluationProgress, TrainingProgress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run_two_tasks(progress: EvaluationProgress) -> None:
    progress.start("task 'piqa'", 10)
    for n in (4, 6):
        progress(n)
    progress.start("lm coqa", 3)
    progress(3)
    progress.close()


def test_a_terminal_gets_a_bar_with_the_total_and_a_line_per_task():
    stream = Terminal()
    run_two_tasks(EvaluationProgress(2, stream=stream))
    text = stream.getvalue()
    assert "[1/2] task 'piqa':   0%" in text and "0/10" in text  # the bar: its total and percentage
    assert "[1/2] task 'piqa': 10 requests in" in text and "[2/2] lm coqa: 3 requests in" in text


def test_a_log_gets_one_plain_line_per_task_and_no_bar(caplog):
    stream = io.StringIO()
    with caplog.at_level(logging.INFO, logger="inloop_eval"):
        run_two_tasks(EvaluationProgress(2, stream=stream))
    assert stream.getvalue() == ""
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and lines[0].startswith("[1/2] task 'piqa': 10 requests in")


def test_ranks_other_than_zero_show_nothing(caplog):
    stream = Terminal()
    with caplog.at_level(logging.INFO, logger="inloop_eval"):
        run_two_tasks(EvaluationProgress(2, enabled=False, stream=stream))
    assert stream.getvalue() == "" and caplog.records == []


def test_the_demo_gets_bars_without_lines():
    stream = Terminal()
    run_two_tasks(EvaluationProgress(2, lines=False, stream=stream))
    assert "/10" in stream.getvalue() and "requests in" not in stream.getvalue()




class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_training_line_gives_the_step_of_the_total_and_the_time_left():
    """150 steps at 2 steps/s with evaluations at 0, 50, 100, 150 of 10 s each: after step 9, 140 steps
    (70 s) and 3 evaluations (30 s) are left; the time spent evaluating does not slow the rate. The first
    line (step 0) gives no ETA: its one step is all the rate there is, one-off costs included."""
    clock = Clock()
    progress = TrainingProgress(150, range(0, 151, 50), clock=clock)
    progress.evaluated(10.0)
    clock.now += 10.0 + 0.5  # the evaluation at step 0, then step 0
    assert progress.line(0, 10.9) == "step   0/150  train loss 10.900  (2.0 steps/s, ETA ?)"
    clock.now += 4.5  # steps 1-9
    assert progress.line(9, 3.4567) == "step   9/150  train loss 3.457  (2.0 steps/s, ETA 01:40)"
    assert progress.step_text(50) == "step  50/150"


def test_the_time_left_counts_no_evaluation_before_one_has_run():
    clock = Clock()
    progress = TrainingProgress(4, [2, 4], clock=clock)
    clock.now += 1.0
    assert progress.line(0, 1.0).endswith("(1.0 steps/s, ETA ?)")
    clock.now += 1.0
    assert progress.line(1, 1.0).endswith("(1.0 steps/s, ETA 00:02)")
    assert TrainingProgress(4, [], clock=clock).line(0, 1.0).endswith("ETA ?)")  # no time passed yet


def evaluate_with(clock: Clock, preparing: float, scoring: float) -> EvaluationProgress:
    """One evaluation of one task on the fake clock: `preparing` seconds before it scores (loading and
    tokenizing its documents), then `scoring` seconds over two batches."""
    progress = EvaluationProgress(1, enabled=False, clock=clock)
    clock.now += preparing
    progress.start("task 'piqa'", 10)
    for n in (4, 6):
        clock.now += scoring / 2
        progress(n)
    progress.close()
    return progress


def test_the_first_time_left_leaves_out_the_first_evaluations_tokenizing():
    """The demo's shape: 150 steps at 2 steps/s, evaluations at 0, 50, 100 and 150. The first evaluation takes
    30 s, 20 of them tokenizing the documents (once: the later evaluations reuse them and take the 10 s of
    scoring). After step 9, 140 steps (70 s) and 3 evaluations (30 s) are left: 01:40, not the 02:40 that
    counting each at the first one's 30 s gives."""
    clock = Clock()
    training = TrainingProgress(150, range(0, 151, 50), clock=clock)
    first = evaluate_with(clock, preparing=20.0, scoring=10.0)
    assert first.scoring_seconds == 10.0
    training.evaluated(30.0, first.scoring_seconds)
    clock.now += 0.5  # step 0
    training.line(0, 10.9)
    clock.now += 4.5  # steps 1-9
    assert training.line(9, 7.0).endswith("(2.0 steps/s, ETA 01:40)")


def test_later_evaluations_are_estimated_from_those_after_the_first():
    clock = Clock()
    training = TrainingProgress(150, range(0, 151, 50), clock=clock)
    training.evaluated(30.0, 10.0)
    clock.now += 25.0  # steps 0-49
    training.line(49, 5.0)
    training.evaluated(12.0, 11.0)
    clock.now += 12.0 + 25.0  # the evaluation at 50, then steps 50-99
    assert training.evaluation_seconds() == 12.0
    # 50 steps at 2 steps/s left (25 s) and the evaluations at 100 and 150 (24 s)
    assert training.line(99, 4.0).endswith("(2.0 steps/s, ETA 00:49)")


def test_the_training_rate_leaves_out_the_first_steps_one_off_cost():
    """The first step takes 3 s (allocating, warming up), the next ones 0.5 s: from the second line on, the rate
    is the steady 2 steps/s, not 11 steps over 8 s."""
    clock = Clock()
    training = TrainingProgress(150, [], clock=clock)
    clock.now += 3.0
    assert training.line(0, 10.0).endswith("(0.3 steps/s, ETA ?)")  # the only rate there is yet: no ETA
    clock.now += 5.0  # steps 1-10
    assert training.line(10, 8.0).endswith("(2.0 steps/s, ETA 01:09)")
