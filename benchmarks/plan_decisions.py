"""Ways of spending a budget on the runs' tasks, and how often each picks the better run of a pair.

A decision between two runs at a step is the sum over the tasks read of the paired z (the mean per-document
difference on the documents read over its standard error; signed so that positive means better); it is right
when it picks the run the ground truth (lower held-out bits per byte) ranks better.

Legend: D documents, K evaluations.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from inloop_eval.metrics.registry import lower_is_better
from inloop_eval.plan.allocate import Allocation, Candidate, CostCurve, allocate
from inloop_eval.plan.noise import RunValues, figure_noise
from inloop_eval.plan.runs import PLAN_FIGURES
from inloop_eval.tasks import get_task
from inloop_eval.tasks.loading import spread_positions

BPB_TWIN = "bpb_gold"
# The figure OLMo-core reads a label on, by OLMo's metric type (`olmo_metric_type`); len_norm falls back to acc
# on letter keys, whose length-normalised accuracy is their accuracy.
OLMO_READ = {"bpb": BPB_TWIN, "ce_loss": "ce_gold", "acc": "acc", "len_norm": "acc_norm", "pmi_dc": "acc_pmi"}
# The baselines' two readings: each label on OLMo-core's figure, or on its bits-per-byte twin.
READINGS = ("olmo", BPB_TWIN)
Values = dict[str, dict[str, RunValues]]  # one run's label -> figure -> values
Pick = tuple[str, str, np.ndarray]  # a task, the figure read on it, the positions of its documents read


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


def accuracy(
    runs: list[Values],
    truth: list[float],
    picks: list[Pick],
    steps: list[int],
    pairs: list[tuple[int, int]] | None = None,
) -> float:
    """The share of `pairs` (of run indices; None: every pair) x steps whose decision matches the truth (lower
    held-out bpb is better); a tie (no evidence, or no task within the budget) counts as half right, a coin's
    toss."""
    scores = []
    for s in steps:
        for a, b in pairs if pairs is not None else itertools.combinations(range(len(runs)), 2):
            z = decide(runs, picks, s, a, b)
            scores.append(0.5 if z == 0 else float((z > 0) == (truth[a] < truth[b])))
    return float(np.mean(scores))


def read_on(label: str, figures: dict[str, RunValues], reading: str) -> str:
    """The figure a baseline reads on a label: its bits-per-byte twin (`reading` "bpb_gold"), or for "olmo"
    the figure of its OLMo metric type (acc where a letter-key task has no acc_norm)."""
    if reading == BPB_TWIN:
        return BPB_TWIN
    figure = OLMO_READ[get_task(label).olmo_metric_type or "acc"]
    return figure if figure in figures else "acc"


def methods(
    runs: list[Values],
    costs: dict[str, CostCurve],
    fit_steps: list[int],
    budget: float,
    rng: np.random.Generator,
    draws: int,
) -> tuple[dict[str, list[list[Pick]]], Allocation]:
    """The picks of each method with `budget` seconds for tasks: {'plan': [picks], 'one limit, olmo': [picks],
    'random, olmo': [picks of each draw], ...}, and the plan."""
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
    out = {
        "plan": [[(t.label, t.figure, spread_positions(n_docs[t.label], t.documents)) for t in plan.kept()]]
    }
    # Any whole number of documents from 2 (a paired standard error needs two), not only the plan's ladder.
    fits = [n for n in range(2, min(n_docs.values()) + 1) if sum(c(n) for c in costs.values()) <= budget]
    for reading in READINGS:
        out[f"one limit, {reading}"] = [
            [
                (label, read_on(label, runs[0][label], reading), spread_positions(n_docs[label], fits[-1]))
                for label in costs
            ]
            if fits
            else []
        ]
        out[f"random, {reading}"] = [
            random_picks(runs, costs, n_docs, budget, rng, reading) for _ in range(draws)
        ]
    return out, plan


def random_picks(
    runs: list[Values],
    costs: dict[str, CostCurve],
    n_docs: dict[str, int],
    budget: float,
    rng: np.random.Generator,
    reading: str,
) -> list[Pick]:
    """Labels in a random order, each with a random number of documents drawn at random, while they fit."""
    picks: list[Pick] = []
    left = budget
    for label in rng.permutation(list(costs)):
        n = int(rng.integers(2, n_docs[label] + 1))
        if costs[label](n) <= left:
            left -= costs[label](n)
            chosen = np.sort(rng.choice(n_docs[label], n, replace=False))
            picks.append((label, read_on(label, runs[0][label], reading), chosen))
    return picks


def trim(values: RunValues, steps: list[int]) -> RunValues:
    """The values at `steps` only."""
    keep = np.isin(values.steps_K, steps)
    return RunValues(values.steps_K[keep], values.doc_id_D, values.values_KD[keep])
