"""A plan written out: the evaluator config it runs (`plan.yaml`, which `InLoopEvaluator.from_yaml` loads as
it is), what it kept and dropped and why (`plan.json`), and the same as a table for the terminal."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import yaml

from inloop_eval.data.files import write_text_atomically
from inloop_eval.data.root import default_data_root, neox_tokenizer_path
from inloop_eval.evaluators.downstream import TaskEvalConfig
from inloop_eval.plan.allocate import TaskPlan, decision_accuracy
from inloop_eval.plan.planner import PlanResult
from inloop_eval.tasks import get_task

CONFIG_FILE = "plan.yaml"
REPORT_FILE = "plan.json"
OBJECTIVE = (
    "sum over kept tasks of z^2, z = signal / sd of the difference of two evaluations (two runs, or two "
    "checkpoints one evaluation apart); a decision combining them is right with probability Phi(sqrt(sum z^2))"
)


def planned_entry(entry: TaskEvalConfig, task: TaskPlan) -> dict[str, Any]:
    """The entry as the plan runs it: `task.documents` spread over the split (all of them: no limit), its
    figure among the reported ones."""
    data = dataclasses.asdict(entry)
    limit = None if task.documents >= task.n_split else task.documents
    data.update(limit=limit, spread=limit is not None, subset_num_batches=None)
    defaults = list(entry.metrics) if entry.metrics is not None else list(get_task(entry.task).metrics)
    if task.figure not in defaults:
        data["metrics"] = [*defaults, task.figure]
    return data


def planned_config(result: PlanResult) -> tuple[dict[str, Any], list[str]]:
    """(the evaluator config of the plan as a YAML mapping, notes on what it changed beyond the tasks)."""
    config = result.config
    tasks = {t.label: t for t in result.allocation.tasks}
    data = config.to_dict()
    entries, notes = [], []
    for entry in config.evaluators:
        if not isinstance(entry, TaskEvalConfig):
            entries.append(dataclasses.asdict(entry))
        elif tasks.get(entry.label, TaskPlan(entry.label)).kept:
            entries.append(planned_entry(entry, tasks[entry.label]))
    kept = {t.label for t in result.allocation.kept()}
    suites = [s for s in config.suite_average if set(s.tasks) <= kept]
    notes += [
        f"suite_average {s.label!r} left out: it averages tasks the plan dropped"
        for s in config.suite_average
        if s not in suites
    ]
    data.update(evaluators=entries, suite_average=[dataclasses.asdict(s) for s in suites])
    if not config.tokenizer:
        root = Path(config.data_root).expanduser() if config.data_root else default_data_root()
        data["tokenizer"] = str(neox_tokenizer_path(root))
        notes.append(
            f"tokenizer: the runs' config named none; the plan names the demo's, {data['tokenizer']}"
        )
    return data, notes


def number(x: float) -> float | None:
    return x if math.isfinite(x) else None


def task_json(task: TaskPlan) -> dict[str, Any]:
    return {
        "label": task.label,
        "kept": task.kept,
        "documents": task.documents,
        "split_documents": task.n_split or None,
        "figure": task.figure or None,
        "seconds": task.seconds,
        "stderr": number(task.stderr),
        "decision_sd": number(task.decision_sd),
        "signal": number(task.signal),
        "snr": task.snr,
        "z2": task.z2,
        "reason": task.reason,
        "figures": {
            name: {k: number(v) if isinstance(v, float) else v for k, v in f.items()}
            for name, f in task.figures.items()
        },
    }


def plan_json(result: PlanResult, notes: list[str]) -> dict[str, Any]:
    """What the plan kept and dropped and why, with what it was priced from."""
    allocation = result.allocation
    return {
        "runs": [str(run.path) for run in result.runs],
        "budget_seconds": result.budget,
        "perplexity_seconds": result.fixed_seconds,
        "planned_seconds": allocation.seconds + result.fixed_seconds,
        "seconds_per_token": result.seconds_per_token,
        "tokens": {
            "measured_per_evaluation": number(result.measured_tokens),
            "planned_for_runs_tasks": result.planned_tokens,
        },
        "objective": {
            "maximised": OBJECTIVE,
            "sum_z2": allocation.objective,
            "decision_accuracy": decision_accuracy(allocation.objective),
        },
        "tasks": [task_json(t) for t in allocation.tasks],
        "notes": [*result.notes, *notes],
    }


def write_plan(result: PlanResult, out_dir: Path) -> tuple[Path, Path, dict[str, Any]]:
    """Write `plan.yaml` and `plan.json` into `out_dir`; their paths and the JSON."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config, notes = planned_config(result)
    report = plan_json(result, notes)
    header = (
        f"# Written by `inloop-eval plan` from {', '.join(report['runs'])}: {len(result.allocation.kept())} tasks "
        f"in {report['planned_seconds']:.2f} s of a {result.budget:.2f} s budget (plan.json says why).\n"
    )
    config_path, report_path = out_dir / CONFIG_FILE, out_dir / REPORT_FILE
    write_text_atomically(config_path, header + yaml.safe_dump(config, sort_keys=False))
    write_text_atomically(report_path, json.dumps(report, indent=1, allow_nan=False) + "\n")
    return config_path, report_path, report


def render_table(report: dict[str, Any]) -> str:
    """The plan as the terminal shows it: one row per task, kept first, then the totals."""
    header = ("task", "figure", "documents", "seconds", "stderr", "snr", "why dropped")
    rows = [header]
    for t in report["tasks"]:
        stderr = "" if t["stderr"] is None else f"{t['stderr']:.4f}"
        rows.append(
            (
                t["label"],
                t["figure"] or "-",
                str(t["documents"]) if t["kept"] else "-",
                f"{t['seconds']:.2f}" if t["kept"] else "-",
                stderr,
                f"{t['snr']:.2f}" if t["kept"] else "-",
                t["reason"],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows
    ]
    objective = report["objective"]
    lines.append(
        f"planned {report['planned_seconds']:.2f} s of {report['budget_seconds']:.2f} s "
        f"(perplexity {report['perplexity_seconds']:.2f} s) at {report['seconds_per_token']:.3g} s/token; "
        f"sum z^2 {objective['sum_z2']:.2f}, predicted decision accuracy {objective['decision_accuracy']:.3f}"
    )
    return "\n".join(line.rstrip() for line in lines)
