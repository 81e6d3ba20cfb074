"""`inloop-eval compare A B`: two evaluations paired on the documents both scored, with the difference's
standard error, interval, p-value and verdict per task and figure (the statistics: `metrics.paired`).

Modules:
- `pairing`: a side (`run`, `run@step`, an `evaluate --outcomes` directory) read into `StepOutcomes`
  (`load_side`), and two sides paired per task and figure (`compare_steps`: `Comparison`, `TaskComparison`),
  documents present in one side only counted, never paired.
- `suites`: a suite average's documents weighted again from those both sides share, so that a changed
  `limit` is not reported as a difference.
- `command`: the CLI glue (`add_arguments`, `run`): the terminal table and `--json`.

It reads logged files as `report` does, and sits at its layer.
"""

from inloop_eval.compare.command import add_arguments, run
from inloop_eval.compare.pairing import Comparison, TaskComparison, compare_steps, load_side

__all__ = ["Comparison", "TaskComparison", "add_arguments", "compare_steps", "load_side", "run"]
