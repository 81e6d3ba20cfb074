"""Spending a budget of seconds: which tasks, which figure of each, how many documents. Pure Python and NumPy.

The objective is the sum over the kept tasks of z^2 (`noise.FigureNoise.z2`): for a decision between two
evaluations (two runs, or two checkpoints one evaluation apart) whose tasks differ by their signals, the
evidence of independent tasks adds as z^2, and the combined decision is right with probability Phi(sqrt(sum z^2))
(`decision_accuracy`). Each task's z^2 grows with its documents and levels off at signal^2 / (2 x
checkpoint_variance); each task's seconds grow with its documents, less than in proportion where documents
share prefixes (`CostCurve`).

Allocation is greedy on marginal z^2 per second: every task starts at none, its documents can grow along a
ladder (`DOCUMENT_LADDER`, up to its split); at each step the task whose next rung buys the most z^2 per
second within the budget takes it, until no rung fits or buys anything. A task's figure is the one with the
highest z^2 at its documents (the cost is the same whichever figure is read).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from inloop_eval.plan.noise import FigureNoise

# The document counts a task may take: roughly x1.5 apart, so that the greedy steps stay fine.
DOCUMENT_LADDER: tuple[int, ...] = (
    10,
    15,
    20,
    30,
    40,
    50,
    75,
    100,
    150,
    200,
    300,
    400,
    500,
    750,
    1000,
    1500,
    2000,
    3000,
    5000,
    7500,
    10000,
    15000,
    20000,
    30000,
    50000,
    75000,
    100000,
)


@dataclass(frozen=True)
class CostCurve:
    """Seconds of one task's evaluation as a function of its documents: `seconds_G` at `documents_G`
    (ascending), linear between them, and beyond the last at the last stretch's rate per document."""

    documents_G: tuple[int, ...]
    seconds_G: tuple[float, ...]

    def __call__(self, n: int) -> float:
        if n <= 0:
            return 0.0
        x, y = np.asarray(self.documents_G, dtype=np.float64), np.asarray(self.seconds_G, dtype=np.float64)
        if n <= x[-1] or len(x) == 1:
            return float(np.interp(n, np.concatenate([[0.0], x]), np.concatenate([[0.0], y])))
        rate = (y[-1] - y[-2]) / (x[-1] - x[-2])
        return float(y[-1] + rate * (n - x[-1]))


@dataclass(frozen=True)
class Candidate:
    """A task the plan may keep: its figures' noise (those with a `problem` are never chosen), the documents
    its split holds and what they cost."""

    label: str
    figures: tuple[FigureNoise, ...]
    n_split: int
    cost: CostCurve

    def ladder(self) -> list[int]:
        """The document counts it may take: the ladder's rungs below its split, and the whole split."""
        return [n for n in DOCUMENT_LADDER if n < self.n_split] + [self.n_split]

    def best(self, n: int) -> tuple[FigureNoise | None, float]:
        """(the figure with the highest z^2 at n documents, that z^2); (None, 0) when no figure can be read."""
        usable = [f for f in self.figures if not f.problem]
        if not usable or n <= 0:
            return None, 0.0
        figure = max(usable, key=lambda f: f.z2(n))
        return figure, figure.z2(n)


@dataclass
class TaskPlan:
    """One task's place in the plan: kept with `documents` read on `figure`, or dropped for `reason`."""

    label: str
    documents: int = 0
    figure: str = ""
    seconds: float = 0.0
    z2: float = 0.0
    stderr: float = math.nan
    decision_sd: float = math.nan
    signal: float = math.nan
    reason: str = ""
    n_split: int = 0
    figures: dict[str, dict[str, float | str]] = field(default_factory=dict)
    """Every figure weighed, by name: its signal and where it was read (`FigureNoise.source`), per-document and
    checkpoint variances, the z at the documents
    the runs evaluated, and the problem that kept it out ('' for none)."""

    @property
    def kept(self) -> bool:
        return self.documents > 0

    @property
    def snr(self) -> float:
        """signal / the standard deviation of a difference of two evaluations: the task's z."""
        return math.sqrt(self.z2)


@dataclass
class Allocation:
    """The plan: every candidate's `TaskPlan` (kept first, by z^2), the seconds spent and the budget."""

    budget: float
    tasks: list[TaskPlan] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.tasks)

    @property
    def objective(self) -> float:
        """sum of z^2 over the kept tasks."""
        return sum(t.z2 for t in self.tasks if t.kept)

    def kept(self) -> list[TaskPlan]:
        return [t for t in self.tasks if t.kept]


def decision_accuracy(total_z2: float) -> float:
    """Phi(sqrt(total_z2)): how often a decision combining the kept tasks picks the right side of a pair that
    differs by every task's signal."""
    return 0.5 * (1.0 + math.erf(math.sqrt(max(total_z2, 0.0)) / math.sqrt(2.0)))


def allocate(candidates: Sequence[Candidate], budget: float) -> Allocation:
    """The greedy allocation of the module docstring; every candidate gets a `TaskPlan`, those left out a
    reason."""
    rung = {c.label: -1 for c in candidates}
    ladders = {c.label: c.ladder() for c in candidates}
    spent = 0.0
    while True:
        step = best_step(candidates, rung, ladders, budget - spent)
        if step is None:
            break
        c, extra = step
        rung[c.label] += 1
        spent += extra
    return Allocation(budget, [task_plan(c, ladders[c.label], rung[c.label], budget) for c in candidates])


def best_step(
    candidates: Sequence[Candidate], rung: dict[str, int], ladders: dict[str, list[int]], left: float
) -> tuple[Candidate, float] | None:
    """(the candidate whose next rung buys the most z^2 per second within `left` seconds, that rung's extra
    seconds); None when no next rung fits or buys anything."""
    best, best_ratio, best_extra = None, 0.0, 0.0
    for c in candidates:
        ladder, i = ladders[c.label], rung[c.label]
        if i + 1 >= len(ladder):
            continue
        now = ladder[i] if i >= 0 else 0
        gain = c.best(ladder[i + 1])[1] - c.best(now)[1]
        extra = c.cost(ladder[i + 1]) - c.cost(now)
        if gain <= 0 or extra > left:
            continue
        ratio = gain / extra if extra > 0 else math.inf
        if ratio > best_ratio:
            best, best_ratio, best_extra = c, ratio, extra
    return (best, best_extra) if best is not None else None


def weighed(figures: Sequence[FigureNoise]) -> dict[str, dict[str, float | str]]:
    """Each figure's estimates, as `TaskPlan.figures` shows them."""
    return {
        f.figure: {
            "signal": f.signal,
            "source": f.source,
            "doc_variance": f.doc_variance,
            "checkpoint_variance": max(f.checkpoint_variance, f.checkpoint_floor),
            "runs_documents": f.n_docs,
            "snr_at_runs_documents": math.sqrt(f.z2(f.n_docs)) if f.n_docs else 0.0,
            "problem": f.problem,
        }
        for f in figures
    }


def task_plan(c: Candidate, ladder: list[int], i: int, budget: float) -> TaskPlan:
    """The `TaskPlan` of candidate `c` at rung i of its ladder (-1: none), with the reason it is dropped."""
    figure, z2 = c.best(ladder[i] if i >= 0 else 0)
    if i >= 0 and figure is not None:
        n = ladder[i]
        return TaskPlan(
            c.label,
            n,
            figure.figure,
            c.cost(n),
            z2,
            figure.stderr(n, c.n_split),
            math.sqrt(2.0 * figure.variance(n)),
            figure.signal,
            n_split=c.n_split,
            figures=weighed(c.figures),
        )
    return TaskPlan(
        c.label, reason=drop_reason(c, ladder, budget), n_split=c.n_split, figures=weighed(c.figures)
    )


def drop_reason(c: Candidate, ladder: list[int], budget: float) -> str:
    """Why candidate `c` took no documents, in words."""
    if not c.figures:
        return "missing: no per-document outcomes of any figure the planner reads"
    if all(f.problem for f in c.figures):
        return shared_problems(c.figures)
    first = ladder[0]
    if c.cost(first) > budget:
        return f"budget: its first {first} documents cost {c.cost(first):.2f} s, more than the {budget:.2f} s for tasks"
    figure, z2 = c.best(first)
    return (
        f"budget: its first {first} documents buy z^2 {z2:.3g} on {figure.figure if figure else '?'} for "
        f"{c.cost(first):.2f} s, less per second than the tasks kept"
    )


def shared_problems(figures: Sequence[FigureNoise]) -> str:
    """The figures' problems, each said once with every figure it names ('acc', 'bpb_gold') together."""
    shared: dict[str, list[str]] = {}
    for f in figures:
        shared.setdefault(f.problem.replace(repr(f.figure), "{figures}"), []).append(repr(f.figure))
    return "; ".join(text.replace("{figures}", ", ".join(names)) for text, names in shared.items())
