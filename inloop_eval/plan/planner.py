"""A plan from run directories, read top to bottom: read the runs, take their evaluator config and seconds per
token, estimate each task figure's noise and signal, price each task's documents, set the budget, allocate.

The runs' `lm` (perplexity) evaluators are kept as they are: their seconds, the runs' measured tokens less
those the engine plans for the runs' downstream entries, come off the budget first.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from inloop_eval.data.root import default_data_root, neox_tokenizer_path
from inloop_eval.data.tokenizer_lookup import find_and_load_tokenizer
from inloop_eval.engine.adapter import AdapterNeeds
from inloop_eval.errors import InLoopEvalError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.downstream import DEFAULT_MAX_LENGTH, TaskEvalConfig
from inloop_eval.plan.allocate import Allocation, Candidate, CostCurve, TaskPlan, allocate
from inloop_eval.plan.cost import POOL_DOCUMENTS, CostSettings, entry_tokens, task_cost
from inloop_eval.plan.noise import figure_noise
from inloop_eval.plan.runs import PLAN_FIGURES, PlanError, RunData, read_run

# The cost of a task none of whose figures can be planned on (it is never given documents).
UNPRICED = CostCurve((1,), (0.0,))


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """What to plan: the runs, the budget (`budget` seconds, `budget_fraction` of the training between the runs'
    evaluations, or `eval_fraction` of their evaluations' measured seconds), and what overrides the runs' own
    records."""

    runs: tuple[Path, ...]
    budget: float | None = None
    budget_fraction: float | None = None
    eval_fraction: float | None = None
    seconds_per_token: float | None = None
    config: EvaluatorConfig | None = None
    packed: bool = True
    device_type: str = "cpu"
    pool: int = POOL_DOCUMENTS
    """Documents of each task tokenized to price it (`cost.POOL_DOCUMENTS`)."""


@dataclass
class PlanResult:
    """A plan and what it was made from: the config it changes, the seconds and tokens it priced with."""

    allocation: Allocation
    config: EvaluatorConfig
    budget: float
    fixed_seconds: float
    seconds_per_token: float
    measured_tokens: float
    planned_tokens: int
    runs: list[RunData] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def run_config(request: PlanRequest, runs: Sequence[RunData]) -> EvaluatorConfig:
    """The evaluator config to plan from: `request.config`, else the one the first run logged."""
    if request.config is not None:
        return request.config
    logged = next((run for run in runs if run.config), None)
    if logged is None:
        shown = ", ".join(str(run.path) for run in runs)
        raise PlanError(
            f"no run of {shown} logged its evaluator config (config.json with `evaluators` or `evaluation`); "
            "pass the config the runs used with --config YAML"
        )
    try:
        return EvaluatorConfig.from_dict(logged.config, f"{logged.path}/config.json")
    except InLoopEvalError as exc:
        raise PlanError(f"run {logged.path}: its logged evaluator config: {exc}") from exc


def seconds_per_token(request: PlanRequest, runs: Sequence[RunData]) -> float:
    """`--seconds-per-token`, else the median of the runs' measured rates; PlanError when neither exists."""
    if request.seconds_per_token is not None:
        return request.seconds_per_token
    rates = [run.seconds_per_token for run in runs if math.isfinite(run.seconds_per_token)]
    if not rates:
        raise PlanError(
            "no run logged eval/seconds and eval/tokens_forwarded (run_and_log records them); pass "
            "--seconds-per-token X (seconds per token forwarded on the machine the plan is for)"
        )
    return statistics.median(rates)


def cost_settings(config: EvaluatorConfig, request: PlanRequest, rate: float) -> CostSettings:
    """The runs' model as the engine plans for it: the config's tokenizer (the demo's GPT-NeoX-20B where it
    names none), data root, context length, and the batch shape of a packing model (or plain rows)."""
    root = Path(config.data_root).expanduser() if config.data_root else default_data_root()
    tokenizer = find_and_load_tokenizer(config.tokenizer or neox_tokenizer_path(root), root)
    needs = AdapterNeeds(packing=request.packed, prefix_reuse=request.packed)
    return CostSettings(
        tokenizer,
        root,
        config.max_length or DEFAULT_MAX_LENGTH,
        config.batch_shape(needs, request.device_type),
        rate,
        request.pool,
    )


def budget_seconds(request: PlanRequest, runs: Sequence[RunData]) -> float:
    """The budget in seconds: `budget`; `budget_fraction` of the median over the runs of their training seconds
    between evaluations (eval/interval_seconds); or `eval_fraction` of the median of their evaluation seconds
    (eval/seconds)."""
    if request.budget is not None:
        return request.budget
    if request.budget_fraction is not None:
        intervals = [run.interval_seconds for run in runs if math.isfinite(run.interval_seconds)]
        if not intervals:
            raise PlanError(
                "--budget-fraction: expected the training seconds between evaluations (eval/interval_seconds, "
                "logged by a training loop's evaluations from the second on) in the runs' metrics, found none in "
                f"{', '.join(str(run.path) for run in runs)}; pass --budget SECONDS, or --eval-fraction F of "
                "their evaluations' seconds"
            )
        return request.budget_fraction * statistics.median(intervals)
    measured = [run.eval_seconds for run in runs if math.isfinite(run.eval_seconds)]
    if request.eval_fraction is None or not measured:
        raise PlanError(
            "--eval-fraction: expected the runs' measured eval/seconds, found none; pass --budget SECONDS"
        )
    return request.eval_fraction * statistics.median(measured)


def candidate(entry: TaskEvalConfig, runs: Sequence[RunData], settings: CostSettings) -> Candidate | None:
    """The entry as the allocation sees it; None when no run holds outcomes of its task."""
    held = [run.values[entry.label] for run in runs if entry.label in run.values]
    if not held:
        return None
    figures = tuple(
        figure_noise(entry.label, figure, [values[figure] for values in held if figure in values])
        for figure in PLAN_FIGURES
        if any(figure in values for values in held)
    )
    if not any(not f.problem for f in figures):
        return Candidate(entry.label, figures, 0, UNPRICED)  # never takes documents: not worth tokenizing
    cost, n_split = task_cost(entry, settings)
    return Candidate(entry.label, figures, n_split, cost)


def make_plan(request: PlanRequest) -> PlanResult:
    """The plan of `request` (module docstring)."""
    runs = [read_run(path) for path in request.runs]
    config = run_config(request, runs)
    rate = seconds_per_token(request, runs)
    if not rate > 0:
        raise PlanError(f"seconds per token {rate!r}: expected a positive number")
    settings = cost_settings(config, request, rate)
    entries = [e for e in config.evaluators if isinstance(e, TaskEvalConfig)]
    planned = sum(entry_tokens(e, settings) for e in entries)
    measured = statistics.median([r.eval_tokens for r in runs if math.isfinite(r.eval_tokens)] or [math.nan])
    fixed = max(measured - planned, 0.0) * rate if len(entries) < len(config.evaluators) else 0.0
    fixed = fixed if math.isfinite(fixed) else 0.0
    budget = budget_seconds(request, runs)
    if budget - fixed <= 0:
        raise PlanError(
            f"budget {budget:.2f} s: the perplexity evaluators kept as they are take {fixed:.2f} s of it; raise "
            "the budget"
        )
    candidates, missing = [], []
    for entry in entries:
        c = candidate(entry, runs, settings)
        if c is None:
            missing.append(TaskPlan(entry.label, reason="missing: no run holds per-document outcomes of it"))
        else:
            candidates.append(c)
    allocation = allocate(candidates, budget - fixed)
    if not allocation.kept() and len(entries) == len(config.evaluators):
        why = "; ".join(f"{t.label}: {t.reason}" for t in [*allocation.tasks, *missing])
        raise PlanError(f"no task is kept within {budget:.3g} s, so there is no evaluation to write ({why})")
    allocation.budget = budget
    allocation.tasks = sorted(allocation.tasks, key=lambda t: (not t.kept, -t.z2, t.label)) + missing
    notes = [note for run in runs for note in run.notes]
    return PlanResult(allocation, config, budget, fixed, rate, measured, planned, runs, notes)
