"""`inloop-eval plan`: the tasks, the figure of each and the documents of each that buy the runs' decisions the
most signal for a budget of seconds. Modules, in the order a plan runs them:
- `runs`: run directories read: each task figure's per-document values over the evaluations, the logged
  evaluator config, the measured seconds per token; `PlanError`.
- `noise`: a task figure's noise as a function of its documents (per-document variance apart from the
  checkpoint-to-checkpoint residual around the trend) and its signal (the trend, or the spread between runs):
  pure NumPy.
- `cost`: the seconds of n documents of a task, from the engine's own plan of their tokens (shared and kept
  prefixes included) times the seconds per token.
- `allocate`: the greedy allocation of marginal z^2 per second under the budget (`CostCurve`, `Candidate`,
  `allocate`): pure.
- `planner`: the steps above in order (`make_plan`).
- `output`: `plan.yaml` (an evaluator config `InLoopEvaluator.from_yaml` runs), `plan.json` and the table.
- `flags`, `command`: the CLI glue (`add_arguments`, `run`, `plan_and_write`); `plan --calibrate`, which
  evaluates saved models first, is the command line's (`cli/plan.py`).

It reads logged files as `report` and `compare` do, and sits at their layer.
"""
