"""What `inloop-eval plan` keeps at the runs' own cost, for the signal-to-noise table of the page comparing
runs: the planner (`plan.planner.make_plan`) run on the runs compared with a budget of the seconds their
evaluations took (the median of their `eval/seconds`, the first evaluation left out: `plan --eval-fraction
1`), each task kept (the figure it is read on, its documents) or dropped (why); or why no plan was made (runs
without outcomes, without their logged evaluator config or measured seconds, or no task kept). The planner's
own functions decide; this module only words and renders what they return.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from inloop_eval.errors import InLoopEvalError
from inloop_eval.plan.allocate import TaskPlan, decision_accuracy
from inloop_eval.plan.planner import PlanRequest, make_plan

# The budget as a fraction of the runs' measured seconds per evaluation: their own cost.
AT_THE_RUNS_COST = 1.0
COMMAND = "inloop-eval plan RUN_A RUN_B ... --eval-fraction 1 --out DIR"


@dataclass(frozen=True)
class PlanAtCost:
    """The plan of the runs at their measured seconds per evaluation: each task's `TaskPlan` by label, the
    budget in seconds, the predicted decision accuracy; or `problem`, why there is none."""

    tasks: dict[str, TaskPlan] = field(default_factory=dict)
    budget: float = math.nan
    decision_accuracy: float = math.nan
    problem: str = ""


def plan_at_cost(run_dirs: Sequence[str | Path]) -> PlanAtCost:
    """`make_plan` of `run_dirs` at AT_THE_RUNS_COST of their measured seconds; a planner's error (any of the
    project's own, e.g. task data it cannot read to price a task) becomes `problem`."""
    request = PlanRequest(runs=tuple(Path(d) for d in run_dirs), eval_fraction=AT_THE_RUNS_COST)
    try:
        result = make_plan(request)
    except InLoopEvalError as exc:
        return PlanAtCost(problem=str(exc))
    allocation = result.allocation
    return PlanAtCost(
        {t.label: t for t in allocation.tasks}, result.budget, decision_accuracy(allocation.objective)
    )


def plan_cell(plan: PlanAtCost, label: str, figure: str) -> str:
    """The table cell of one task figure: kept on it (its documents), kept on another figure, or dropped (the
    reason in full as the cell's tooltip)."""
    task = plan.tasks.get(label)
    if task is None:
        why = plan.problem or "not in the runs' evaluator config"
        return f"<td class='l' title='{escape(why)}'>–</td>"
    if not task.kept:
        kind = task.reason.split(":", 1)[0]
        return f"<td class='l' title='{escape(task.reason)}'>dropped ({escape(kind)})</td>"
    if task.figure != figure:
        return f"<td class='l'>kept on {escape(task.figure)}</td>"
    split = f" of {task.n_split}" if task.n_split else ""
    return f"<td class='l'><b>kept: {task.documents}{split} documents</b></td>"


def plan_paragraph(plan: PlanAtCost) -> str:
    """What the plan keeps and drops at the runs' cost, or why there is no plan, under the table."""
    if plan.problem:
        return f"<p class='note'>Plan at the runs' cost (<code>{COMMAND}</code>): none made: {escape(plan.problem)}</p>"
    kept = [t for t in plan.tasks.values() if t.kept]
    dropped = [t for t in plan.tasks.values() if not t.kept]
    words = [
        f"at the {plan.budget:.2f} s the runs' evaluations took (the median of their eval/seconds, the first "
        f"left out), the planner keeps {len(kept)} of {len(plan.tasks)} tasks"
    ]
    words += [f"{t.label} on {t.figure} ({t.documents} documents, {t.seconds:.2f} s)" for t in kept]
    words += [f"drops {t.label} ({t.reason})" for t in dropped]
    return (
        f"<p>Plan at the runs' cost (<code>{COMMAND}</code> writes it as an evaluator config): "
        + escape("; ".join(words))
        + f"; predicted decision accuracy {plan.decision_accuracy:.3f}.</p>"
    )
