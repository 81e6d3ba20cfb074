"""Does a plan decide better than a fixed task set or a random one at the same seconds?

    python -m benchmarks.plan --cache runs/plan_benchmark

Builds (once; kept under --cache and reused) RUNS runs of a small reference GPT trained on the demo's text
(`inloop_eval.demo.run`'s passages and held-out split), alike but for the learning rate, each evaluated at
EVALUATIONS checkpoints on TASKS (LIMIT documents each, spread over the split, every default figure kept as
per-document outcomes) through `run_and_log` into a run directory; at the last step, the held-out perplexity of
every held-out passage (no token cap) gives the ground truth: the runs ordered by their mean bits per byte.

Then, for budgets of 5%, 10% and 25% of the full evaluation's seconds (every task at LIMIT documents, priced by
the engine's plan at the runs' measured seconds per token), three ways to spend them:
- plan: the planner's estimates (`inloop_eval.plan.noise`) fitted on the first half of every run's checkpoints,
  its allocation (`inloop_eval.plan.allocate`) of tasks, figures and documents;
- one limit: every task at the largest document count (from 2) that every task can take within the budget,
  read on its accuracy (acc_norm, or acc where it has none) or on its bits-per-byte twin (bpb_gold) (a stand-in for a fixed task set with one `limit`; not
  OLMo-core's `fast` labels, which are 5-shot letter-key tasks a model this small cannot read);
- random: tasks in a random order, each with a random number of documents (from 2 to all) drawn at random,
  while they fit, read on accuracy or on bpb_gold as above; --draws draws.
Each is scored at every checkpoint of the second half: for each pair of runs, the sum over its tasks of the
paired z (the mean per-document difference on its documents over its standard error; signs set so that
positive means better) picks a winner; the decision accuracy is the share of pairs x checkpoints where that
winner is the one the ground truth ranks better. All three combine tasks by the same rule.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inloop_eval import InLoopEvaluator
from inloop_eval.data.root import default_data_root, neox_tokenizer_path
from inloop_eval.data.tokenizer_lookup import find_and_load_tokenizer
from inloop_eval.demo.run import load_passages, split_heldout, token_stream, write_heldout
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.measured import run_and_log
from inloop_eval.loggers import JSONLLogger
from inloop_eval.metrics.registry import lower_is_better
from inloop_eval.models.gpt import GPT, GPTConfig
from inloop_eval.plan.allocate import DOCUMENT_LADDER, Allocation, Candidate, CostCurve, allocate
from inloop_eval.plan.cost import task_requests, tokens_by_documents
from inloop_eval.plan.noise import RunValues, figure_noise
from inloop_eval.plan.planner import PlanRequest, cost_settings
from inloop_eval.plan.runs import PLAN_FIGURES, read_run

TASKS = ("hellaswag", "piqa", "arc_easy", "arc_challenge", "sciq", "openbookqa", "winogrande")
LEARNING_RATES = (2e-4, 4e-4, 8e-4, 1.6e-3, 3.2e-3, 6.4e-3)
EVALUATIONS = 8
BUDGETS = (0.05, 0.10, 0.25)
MODEL = GPTConfig(vocab_size=50304, d_model=64, n_layers=2, n_heads=2, max_seq_len=512)
DONE = "done.json"
Values = dict[str, dict[str, RunValues]]  # one run's label -> figure -> values
Pick = tuple[str, str, np.ndarray]  # a task, the figure read on it, the positions of its documents read


def eval_config(limit: int, root: Path) -> EvaluatorConfig:
    """The runs' evaluation: every task at `limit` documents spread over its split."""
    return EvaluatorConfig.from_dict(
        {
            "tokenizer": str(neox_tokenizer_path(root)),
            "data_root": str(root),
            "max_length": 512,
            "eval_interval": 1,
            "evaluators": [{"task": t, "limit": limit, "spread": True} for t in TASKS],
        }
    )


def heldout_config(run_dir: Path, root: Path) -> EvaluatorConfig:
    """The ground truth's evaluation: every held-out passage of the run, no token cap."""
    domains = [
        {"label": s, "paths": [str(run_dir / "heldout" / f"{s}.jsonl")], "format": "jsonl"}
        for s in ("coqa", "drop", "squad")
    ]
    return EvaluatorConfig.from_dict(
        {
            "tokenizer": str(neox_tokenizer_path(root)),
            "data_root": str(root),
            "evaluators": [
                {"type": "lm", "seq_len": 128, "domains": domains, "cache_dir": str(run_dir / "lm")}
            ],
        }
    )


def build_run(run_dir: Path, lr: float, args: argparse.Namespace, root: Path) -> None:
    """Train one run, evaluating at EVALUATIONS checkpoints, then its held-out bits per byte (DONE)."""
    tokenizer = find_and_load_tokenizer(neox_tokenizer_path(root), root)
    passages, heldout = split_heldout(load_passages(root), 40)
    write_heldout(run_dir, heldout)
    stream = token_stream(passages, tokenizer)
    torch.manual_seed(0)
    model = GPT(MODEL)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.steps, eta_min=lr / 10)
    config = eval_config(args.limit, root)
    evaluator = InLoopEvaluator(config, tokenizer=tokenizer)
    logger = JSONLLogger(run_dir)
    logger.log_config({"evaluation": config.to_dict(), "lr": lr})
    checkpoints = set(np.linspace(args.steps // EVALUATIONS, args.steps, EVALUATIONS).astype(int).tolist())
    rng = np.random.default_rng(0)
    for step in range(1, args.steps + 1):
        starts = rng.integers(0, len(stream) - 129, size=8)
        batch = torch.from_numpy(np.stack([stream[s : s + 129] for s in starts]))
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if step in checkpoints:
            metrics = run_and_log(evaluator, model, step, logger)
            print(f"lr {lr:g} step {step}: {metrics['eval/seconds']:.1f} s", flush=True)
    heldout = InLoopEvaluator(heldout_config(run_dir, root), tokenizer=tokenizer).run(model, step=args.steps)
    bpb = float(np.mean([v for k, v in heldout.items() if k.endswith("/bpb")]))
    logger.finish()
    (run_dir / DONE).write_text(json.dumps({"lr": lr, "heldout_bpb": bpb}))


def oriented(values: RunValues, figure: str) -> RunValues:
    """Values signed so that higher is better."""
    return RunValues(
        values.steps_K, values.doc_id_D, -values.values_KD if lower_is_better(figure) else values.values_KD
    )


def decide(runs: list[Values], picks: list[Pick], step: int, a: int, b: int) -> float:
    """The sum over `picks` (task, figure, document positions) of the paired z of run a over run b at `step`."""
    total = 0.0
    for label, figure, positions in picks:
        va, vb = oriented(runs[a][label][figure], figure), oriented(runs[b][label][figure], figure)
        diff = (
            va.values_KD[list(va.steps_K).index(step), positions]
            - vb.values_KD[list(vb.steps_K).index(step), positions]
        )
        sd = diff.std(ddof=1) if len(diff) > 1 else 0.0
        total += diff.mean() / (sd / math.sqrt(len(diff))) if sd > 0 else 0.0
    return total


def accuracy(runs: list[Values], truth: list[float], picks: list[Pick], steps: list[int]) -> float:
    """The share of pairs x steps whose decision matches the truth (lower held-out bpb is better); a tie (no
    evidence, or no task within the budget) counts as half right, a coin's toss."""
    scores = []
    for s in steps:
        for a, b in itertools.combinations(range(len(runs)), 2):
            z = decide(runs, picks, s, a, b)
            scores.append(0.5 if z == 0 else float((z > 0) == (truth[a] < truth[b])))
    return float(np.mean(scores))


def read_on(figures: dict[str, RunValues], figure: str) -> str:
    """The figure a baseline reads: `figure` (bpb_gold), or for "accuracy" acc_norm where the task has it,
    else acc."""
    if figure != "accuracy":
        return figure
    return "acc_norm" if "acc_norm" in figures else "acc"


def spread(n: int, n_docs: int) -> np.ndarray:
    """n positions evenly spaced over n_docs."""
    return np.unique(np.linspace(0, n_docs - 1, n).round().astype(int))


def methods(
    runs: list[Values],
    costs: dict[str, CostCurve],
    fit_steps: list[int],
    budget: float,
    rng: np.random.Generator,
    draws: int,
) -> tuple[dict[str, list[list[Pick]]], Allocation]:
    """The picks of each method at `budget` seconds: {'plan': [picks], 'one limit': [picks], 'random': [...]}."""
    n_docs = {label: len(next(iter(runs[0][label].values())).doc_id_D) for label in costs}
    candidates = []
    for label, cost in costs.items():
        figures = tuple(
            figure_noise(label, f, [trim(run[label][f], fit_steps) for run in runs])
            for f in PLAN_FIGURES
            if f in runs[0][label]
        )
        candidates.append(Candidate(label, figures, n_docs[label], cost))
    plan = allocate(candidates, budget)
    out = {"plan": [[(t.label, t.figure, spread(t.documents, n_docs[t.label])) for t in plan.kept()]]}
    # Any whole number of documents from 2 (a paired standard error needs two), not only the plan's ladder.
    fits = [n for n in range(2, min(n_docs.values()) + 1) if sum(c(n) for c in costs.values()) <= budget]
    for figure in ("accuracy", "bpb_gold"):
        out[f"one limit, {figure}"] = [
            [(label, read_on(runs[0][label], figure), spread(fits[-1], n_docs[label])) for label in costs]
            if fits
            else []
        ]
        out[f"random, {figure}"] = [
            random_picks(runs, costs, n_docs, budget, rng, figure) for _ in range(draws)
        ]
    return out, plan


def random_picks(
    runs: list[Values],
    costs: dict[str, CostCurve],
    n_docs: dict[str, int],
    budget: float,
    rng: np.random.Generator,
    figure: str,
) -> list[Pick]:
    """Tasks in a random order, each with a random number of documents drawn at random, while they fit."""
    picks: list[Pick] = []
    left = budget
    for label in rng.permutation(list(costs)):
        n = int(rng.integers(2, n_docs[label] + 1))
        if costs[label](n) <= left:
            left -= costs[label](n)
            picks.append(
                (label, read_on(runs[0][label], figure), np.sort(rng.choice(n_docs[label], n, replace=False)))
            )
    return picks


def trim(values: RunValues, steps: list[int]) -> RunValues:
    """The values at `steps` only."""
    keep = np.isin(values.steps_K, steps)
    return RunValues(values.steps_K[keep], values.doc_id_D, values.values_KD[keep])


def analyse(run_dirs: list[Path], args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """The three methods' decision accuracies per budget (module docstring), with what they were made from."""
    data = [read_run(d) for d in run_dirs]
    truth = [json.loads((d / DONE).read_text())["heldout_bpb"] for d in run_dirs]
    runs = [run.values for run in data]
    for label, figures in runs[0].items():
        for figure, values in figures.items():
            if any(not np.array_equal(run[label][figure].doc_id_D, values.doc_id_D) for run in runs):
                raise SystemExit(f"task {label!r} figure {figure!r}: the runs hold different documents")
    steps = sorted(set.intersection(*(set(v["piqa"]["acc"].steps_K.tolist()) for v in runs)))
    fit_steps, score_steps = steps[: len(steps) // 2], steps[len(steps) // 2 :]
    rate = float(np.median([run.seconds_per_token for run in data]))
    config = eval_config(args.limit, root)
    settings = cost_settings(config, PlanRequest(runs=tuple(run_dirs), budget=1.0), rate)
    costs = {}
    for entry in config.evaluators:
        table = task_requests(entry, settings, args.limit, True)
        rungs = [n for n in DOCUMENT_LADDER if n < args.limit] + [args.limit]
        tokens = tokens_by_documents(table, rungs, entry.batch_tokens, settings)
        costs[entry.label] = CostCurve(tuple(rungs), tuple(t * rate for t in tokens))
    full = sum(c(args.limit) for c in costs.values())
    rng = np.random.default_rng(0)
    rows = []
    for fraction in BUDGETS:
        picks, plan = methods(runs, costs, fit_steps, fraction * full, rng, args.draws)
        row: dict[str, Any] = {"budget": fraction, "seconds": fraction * full}
        for name, draws in picks.items():
            row[name] = float(np.mean([accuracy(runs, truth, p, score_steps) for p in draws]))
        row["plan_kept"] = {t.label: [t.figure, t.documents] for t in plan.kept()}
        rows.append(row)
    full_picks = {
        figure: [(label, read_on(runs[0][label], figure), np.arange(args.limit)) for label in costs]
        for figure in ("accuracy", "bpb_gold")
    }
    return {
        "learning_rates": list(LEARNING_RATES[: args.runs]),
        "heldout_bpb": truth,
        "fit_steps": fit_steps,
        "score_steps": score_steps,
        "seconds_per_token": rate,
        "full_seconds": full,
        "full_evaluation": {
            figure: accuracy(runs, truth, picks, score_steps) for figure, picks in full_picks.items()
        },
        "budgets": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default="runs/plan_benchmark", help="where the runs are built and kept")
    parser.add_argument(
        "--runs", type=int, default=len(LEARNING_RATES), help="runs (learning rates), at most 6"
    )
    parser.add_argument("--steps", type=int, default=64, help="training steps of each run")
    parser.add_argument("--limit", type=int, default=100, help="documents of each task evaluated")
    parser.add_argument("--draws", type=int, default=20, help="random subsets drawn per budget")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    root = default_data_root()
    run_dirs = []
    for lr in LEARNING_RATES[: args.runs]:
        run_dir = Path(args.cache) / f"lr_{lr:g}_steps_{args.steps}_limit_{args.limit}"
        if not (run_dir / DONE).is_file():
            started = time.perf_counter()
            build_run(run_dir, lr, args, root)
            print(f"built {run_dir} in {time.perf_counter() - started:.0f} s", flush=True)
        run_dirs.append(run_dir)
    result = analyse(run_dirs, args, root)
    print(json.dumps(result, indent=1))
    (Path(args.cache) / "result.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
