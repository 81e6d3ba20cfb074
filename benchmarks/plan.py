"""Does a plan decide better than a fixed task set or a random one at the same seconds?

    python -m benchmarks.plan --cache runs/plan_benchmark

Builds (once; kept under --cache and reused) RUNS runs of a small reference GPT trained on the demo's text
(`inloop_eval.demo.run`'s passages and held-out split), alike but for the learning rate (a factor whose
direction is known at this length: each doubling trains faster), each evaluated at EVALUATIONS checkpoints
through `run_and_log` into a run directory on OLMo-core's `fast` task set (every label of its
`TASK_GROUPS["fast"]`: letter-key and ranked-choice labels with their bits-per-byte twins, LIMIT documents each
spread over the split, every default figure kept as per-document outcomes) and on the demo's held-out text (an
`lm` evaluator, PERPLEXITY_TOKENS per domain); the last checkpoint's weights are kept. At the last step, the
held-out perplexity of every held-out passage (no token cap) gives the ground truth: the runs ordered by their
mean bits per byte.

Then, for budgets of 5%, 10% and 25% of the full evaluation's seconds (every task at LIMIT documents, priced by
the engine's plan at the runs' measured seconds per token, plus the perplexity evaluator, whose seconds every
way below pays first), three ways to spend them on tasks:
- plan: the planner's estimates (`inloop_eval.plan.noise`) fitted on the first half of every run's checkpoints,
  its allocation (`inloop_eval.plan.allocate`) of tasks, figures and documents;
- one limit: every `fast` label at the largest document count (from 2) that every label can take within the
  budget, read on the figure OLMo-core reads it on (its metric type: bpb_gold, acc or acc_norm) or on every
  label's bits-per-byte twin (bpb_gold);
- random: labels in a random order, each with a random number of documents (from 2 to all) drawn at random,
  while they fit, read as above; --draws draws.
Each is scored at every checkpoint of the second half: for each pair of runs, the sum over its tasks of the
paired z (the mean per-document difference on its documents over its standard error; signs set so that
positive means better) picks a winner; the decision accuracy is the share of pairs x checkpoints where that
winner is the one the ground truth ranks better, over every pair and over the pairs one learning rate apart
(the closest). All three combine tasks by the same rule.

Two checks of what a plan promises:
- standard error: each kept figure's predicted `stderr` (as plan.json gives it; the split is the LIMIT
  documents the runs evaluated, so a figure read on all of them has none) against the one observed over
  --draws fresh samples of the planned size, drawn without replacement from those documents: per run, the
  root mean square over checkpoints of the samples' standard deviation, the median over runs (the plan's is
  one run's, from the median of the runs' level variances); at the checkpoints of the second half (not used
  for fitting) and at the last checkpoint fitted on;
- seconds: `make_plan` on every run and checkpoint at each budget writes plan.yaml (`write_plan`, as
  `inloop-eval plan RUN... --budget S --out DIR` does); the config is run through `InLoopEvaluator` on the
  last checkpoint of the middle run, four times (the first also tokenizes, which the runs' rate leaves out),
  and the median seconds of the other three are compared with the budget, and with the planned seconds
  repriced at the seconds per token of the full evaluation timed just before on the same weights (the
  machine is shared).

Beside it: `plan_runs` builds and keeps the runs, `plan_decisions` scores each way of spending a budget,
`plan_checks` holds the two checks; this module reads the runs, puts them together and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.plan_checks import BUDGETS, stderr_check, timing
from benchmarks.plan_decisions import BPB_TWIN, READINGS, accuracy, methods, read_on
from benchmarks.plan_runs import DONE, LEARNING_RATES, TASK_SET, build_run, checkpoint_steps, eval_config
from inloop_eval.data.root import default_data_root
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.downstream import TaskEvalConfig
from inloop_eval.plan.allocate import DOCUMENT_LADDER, CostCurve
from inloop_eval.plan.cost import task_requests, tokens_by_documents
from inloop_eval.plan.planner import PlanRequest, cost_settings
from inloop_eval.plan.runs import RunData, read_run


def task_costs(
    config: EvaluatorConfig, run_dirs: list[Path], limit: int, rate: float
) -> dict[str, CostCurve]:
    """Each task's seconds at the ladder's rungs up to `limit` documents, spread over the `limit` the runs
    evaluated, as the engine plans them, at `rate` seconds per token."""
    settings = cost_settings(config, PlanRequest(runs=tuple(run_dirs), budget=1.0), rate)
    costs = {}
    for entry in config.evaluators:
        if not isinstance(entry, TaskEvalConfig):
            continue
        table = task_requests(entry, settings, limit, True)
        rungs = [n for n in DOCUMENT_LADDER if n < limit] + [limit]
        tokens = tokens_by_documents(table, rungs, entry.batch_tokens, settings)
        costs[entry.label] = CostCurve(tuple(rungs), tuple(t * rate for t in tokens))
    return costs


def perplexity_seconds(data: list[RunData], costs: dict[str, CostCurve], limit: int, rate: float) -> float:
    """The perplexity evaluator's seconds, as `make_plan` prices them: the runs' measured tokens less the
    tasks' planned ones, at `rate`."""
    measured = float(np.median([run.eval_tokens for run in data]))
    return max(measured - sum(c(limit) for c in costs.values()) / rate, 0.0) * rate


def analyse(run_dirs: list[Path], args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """The three methods' decision accuracies per budget and the two checks (the package docstring)."""
    data = [read_run(d) for d in run_dirs]
    truth = [json.loads((d / DONE).read_text())["heldout_bpb"] for d in run_dirs]
    runs = [run.values for run in data]
    for label, figures in runs[0].items():
        for figure, values in figures.items():
            if any(not np.array_equal(run[label][figure].doc_id_D, values.doc_id_D) for run in runs):
                raise SystemExit(f"task {label!r} figure {figure!r}: the runs hold different documents")
    steps = checkpoint_steps(args.steps)
    fit_steps, score_steps = steps[: len(steps) // 2], steps[len(steps) // 2 :]
    rate = float(np.median([run.seconds_per_token for run in data]))
    costs = task_costs(eval_config(args.limit, root, Path(args.cache)), run_dirs, args.limit, rate)
    fixed = perplexity_seconds(data, costs, args.limit, rate)
    full = sum(c(args.limit) for c in costs.values()) + fixed
    # The pairs one learning rate apart: the closest, and so the hardest, decisions.
    adjacent = [(i, i + 1) for i in range(len(runs) - 1)]
    rng = np.random.default_rng(0)
    rows = []
    for fraction in BUDGETS:
        picks, plan = methods(runs, costs, fit_steps, fraction * full - fixed, rng, args.draws)
        row: dict[str, Any] = {"budget": fraction, "seconds": fraction * full}
        for name, draws in picks.items():
            row[name] = float(np.mean([accuracy(runs, truth, p, score_steps) for p in draws]))
            row[f"{name}, adjacent"] = float(
                np.mean([accuracy(runs, truth, p, score_steps, adjacent) for p in draws])
            )
        row["plan_kept"] = {t.label: [t.figure, t.documents] for t in plan.kept()}
        checked = {"scored checkpoints": score_steps, "last fitted checkpoint": fit_steps[-1:]}
        row["stderr"] = stderr_check(runs, plan, checked, args.draws, rng)
        rows.append(row)
    full_picks = {
        reading: [(label, read_on(label, runs[0][label], reading), np.arange(args.limit)) for label in costs]
        for reading in READINGS
    }
    return {
        "task_set": TASK_SET,
        "tasks": len(costs),
        "learning_rates": list(LEARNING_RATES[: args.runs]),
        "heldout_bpb": truth,
        "fit_steps": fit_steps,
        "score_steps": score_steps,
        "seconds_per_token": rate,
        "perplexity_seconds": fixed,
        "full_seconds": full,
        "full_evaluation": {r: accuracy(runs, truth, p, score_steps) for r, p in full_picks.items()},
        "full_evaluation, adjacent": {
            r: accuracy(runs, truth, p, score_steps, adjacent) for r, p in full_picks.items()
        },
        "budgets": rows,
    }


def accuracy_table(result: dict[str, Any], pairs: str = "") -> list[str]:
    """Decision accuracy per budget and method (`pairs` ", adjacent": of the pairs one learning rate apart
    only), then the full evaluation's."""
    names = ["plan", "one limit, olmo", "one limit, bpb_gold", "random, olmo", "random, bpb_gold"]
    lines = ["| budget | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for row in result["budgets"]:
        cells = [f"{row[n + pairs]:.3f}" for n in names]
        lines.append(f"| {row['budget']:.0%} ({row['seconds']:.2f} s) | " + " | ".join(cells) + " |")
    full = result["full_evaluation" + pairs]
    lines.append(
        f"full evaluation ({result['full_seconds']:.2f} s, perplexity {result['perplexity_seconds']:.2f} s): "
        f"olmo {full['olmo']:.3f}, bpb_gold {full[BPB_TWIN]:.3f}"
    )
    return lines


def stderr_table(result: dict[str, Any]) -> list[str]:
    """Each kept figure's predicted standard error against the observed ones, per budget."""
    lines = [
        "| budget | task | figure | documents | predicted stderr | observed, scored checkpoints (ratio) "
        "| observed, last fitted checkpoint (ratio) |",
        "|---" * 7 + "|",
    ]
    for row in result["budgets"]:
        for s in row["stderr"]:
            observed = [
                f"{s['observed, ' + name]:.4f} ({s['ratio, ' + name]:.2f})"
                for name in ("scored checkpoints", "last fitted checkpoint")
            ]
            lines.append(
                f"| {row['budget']:.0%} | {s['label']} | {s['figure']} | {s['documents']} of {s['of']} | "
                f"{s['predicted']:.4f} | " + " | ".join(observed) + " |"
            )
    return lines


def timing_table(result: dict[str, Any]) -> list[str]:
    """Each budget's plan.yaml: its measured seconds against the budget and against its planned seconds at
    the rate measured beside it; nothing when the check was skipped (`--no-timing`)."""
    if "timing" not in result:
        return []
    lines = [
        "| budget | kept | planned | measured (median of 3) | measured / budget | tokens planned, forwarded "
        "| s/token planned, now | measured / planned at the rate now |",
        "|---" * 8 + "|",
    ]
    for t in result.get("timing", []):
        if "skipped" in t:
            lines.append(f"| {t['budget']:.2f} s | skipped: {t['skipped']} |")
            continue
        lines.append(
            f"| {t['budget']:.2f} s | {t['kept']} | {t['planned_seconds']:.2f} s | {t['seconds']:.2f} s | "
            f"{t['seconds_over_budget']:.2f} | {t['planned_tokens']:,}, {t['tokens_forwarded']:,.0f} | "
            f"{t['planned_seconds_per_token']:.2e}, {t['seconds_per_token_now']:.2e} | "
            f"{t['seconds_over_planned_at_rate_now']:.2f} |"
        )
    return lines


def render(result: dict[str, Any]) -> str:
    """The figures as tables: decision accuracy per budget, the standard errors, the seconds."""
    tables = [
        accuracy_table(result),
        accuracy_table(result, ", adjacent"),
        stderr_table(result),
        timing_table(result),
    ]
    return "\n\n".join("\n".join(t) for t in tables if t)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default="runs/plan_benchmark", help="where the runs are built and kept")
    parser.add_argument(
        "--runs", type=int, default=len(LEARNING_RATES), help="runs (learning rates), at most 6"
    )
    parser.add_argument("--steps", type=int, default=48, help="training steps of each run")
    parser.add_argument("--limit", type=int, default=50, help="documents of each task evaluated")
    parser.add_argument(
        "--draws", type=int, default=20, help="random subsets and fresh samples drawn per budget"
    )
    # One thread: on cores shared with other jobs, a second thread waits on the first and slows the run
    # several times (measured: 5.8 s against 38 s for one evaluation at a load of 4 on 2 cores).
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--no-timing", action="store_true", help="skip the plan.yaml seconds check")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    root = default_data_root()
    run_dirs = []
    for lr in LEARNING_RATES[: args.runs]:
        run_dir = Path(args.cache) / f"{TASK_SET}_lr_{lr:g}_steps_{args.steps}_limit_{args.limit}"
        if not (run_dir / DONE).is_file():
            started = time.perf_counter()
            build_run(run_dir, lr, args, root)
            print(f"built {run_dir} in {time.perf_counter() - started:.0f} s", flush=True)
        run_dirs.append(run_dir)
    result = analyse(run_dirs, args, root)
    if not args.no_timing:
        result["timing"] = timing(run_dirs, result["full_seconds"], args, root)
    (Path(args.cache) / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
