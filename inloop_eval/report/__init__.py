"""`inloop-eval report RUN_DIR`: one HTML page of a run's evaluations over training steps.

For every task, acc, acc_norm and acc_pmi (those it reports) on one chart, with ±1 standard error bands
when logged, and flags (acc and acc_norm diverging, letter keys, figures not finite, documents left out for
non-finite scores); for every perplexity domain (`eval/lm/<domain>/...`), ppl and bits per byte. Modules, in
the order the report runs them:
- `runs`: a run directory (`metrics.jsonl` + `config.json`, or a W&B run file) read into a `RunHistory`,
  skipping and naming what it cannot read; `ReportError`.
- `analysis`: per-task views (`task_views`): the divergence flag, length normalisation a no-op by
  construction (letter keys), failures, figures that are not finite or cover a subset of the documents.
- `signal`: with two or more runs, signal-to-noise per task figure as "Signal and Noise" defines it
  (`signal_to_noise`), and the tasks whose noise exceeds their signal pointed to their bpb twin.
- `plots`: the PNGs (matplotlib, optional and imported only when drawing), labels drawn verbatim.
- `page`: `write_report`, the HTML page and its PNGs (one file name per label; a plot that fails costs
  only that plot).
- `planned`: what `inloop-eval plan` keeps at the runs' own cost (`plan_at_cost`, the planner's functions
  called), a column of the comparison's signal-to-noise table.
- `comparison`: `write_comparison`, the page of two or more runs (`inloop-eval report RUN_A RUN_B`): curves
  of every run with bands, per step the paired verdicts on their outcomes, signal-to-noise with the plan.
- `command`: the CLI glue (`add_arguments`, `run`, `main`), imported by name (`inloop_eval.report.command`).

The names below are re-exported here. Neither `comparison` nor `command` is imported here: the comparison
calls the planner, which reads runs through `report.runs`, so importing the planner first must not bring the
comparison back in through this package's own import.
"""

from inloop_eval.report.analysis import TaskView, divergence, task_views
from inloop_eval.report.page import render_html, write_report
from inloop_eval.report.runs import ReportError, RunHistory, load_run

__all__ = [
    "ReportError",
    "RunHistory",
    "TaskView",
    "divergence",
    "load_run",
    "render_html",
    "task_views",
    "write_report",
]
