"""The greedy allocation on synthetic tasks with known signal, noise and cost: it keeps the tasks that carry
signal, reads each on its figure with the higher SNR, spends documents where z^2 per second is highest, stays
within the budget, and reports tasks it cannot plan on; its objective against exhaustive search."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from plan_outcomes import Truth, run_values

from inloop_eval.plan.allocate import Candidate, CostCurve, allocate, decision_accuracy
from inloop_eval.plan.noise import FigureNoise, RunValues, figure_noise


def linear_cost(seconds_per_document: float, n_max: int = 5000) -> CostCurve:
    return CostCurve((1, n_max), (seconds_per_document, seconds_per_document * n_max))


def known(
    label: str, figure: str, signal: float, doc_variance: float, checkpoint_variance: float = 0.0
) -> FigureNoise:
    return FigureNoise(label, figure, 100, doc_variance, checkpoint_variance, doc_variance, signal, "trend")


def test_the_cost_curve_interpolates_from_zero_and_extends_at_the_last_rate():
    curve = CostCurve((10, 20, 40), (1.0, 1.5, 2.0))
    reference_n = np.array([0, 5, 10, 15, 20, 30, 40])
    expected = np.interp(reference_n, [0, 10, 20, 40], [0.0, 1.0, 1.5, 2.0])
    assert [curve(int(n)) for n in reference_n] == pytest.approx(expected.tolist())
    assert curve(60) == pytest.approx(2.0 + 20 * (0.5 / 20))


def test_it_keeps_the_tasks_that_carry_signal():
    """Three tasks whose curves rise and three flat ones, same noise and cost: the budget goes to the rising."""
    candidates = []
    for i in range(6):
        truth = Truth(slope=0.003 if i % 2 == 0 else 0.0, doc_sd=0.3, checkpoint_sd=0.002)
        runs = [run_values(truth, seed=100 + i, n_docs=300)]
        figures = (figure_noise(f"task{i}", "bpb_gold", runs),)
        candidates.append(Candidate(f"task{i}", figures, 5000, linear_cost(0.01)))
    plan = allocate(candidates, budget=20.0)
    assert {t.label for t in plan.kept()} == {"task0", "task2", "task4"}
    assert plan.seconds <= 20.0


def test_it_reads_each_task_on_its_figure_with_the_higher_snr():
    acc_better = Candidate(
        "a", (known("a", "acc", 0.05, 0.2), known("a", "bpb_gold", 0.05, 0.8)), 5000, linear_cost(0.01)
    )
    bpb_better = Candidate(
        "b", (known("b", "acc", 0.05, 0.8), known("b", "bpb_gold", 0.05, 0.2)), 5000, linear_cost(0.01)
    )
    plan = allocate([acc_better, bpb_better], budget=10.0)
    figures = {t.label: t.figure for t in plan.tasks}
    assert figures == {"a": "acc", "b": "bpb_gold"}


def test_it_spends_documents_where_signal_per_second_is_highest():
    """Two tasks alike but for their cost per document: the cheaper takes more documents, and at the end no
    rung of one task buys more z^2 per second than the last rung of the other did."""
    cheap = Candidate("cheap", (known("cheap", "acc", 0.05, 0.25),), 10000, linear_cost(0.001))
    dear = Candidate("dear", (known("dear", "acc", 0.05, 0.25),), 10000, linear_cost(0.004))
    plan = allocate([cheap, dear], budget=4.0)
    n = {t.label: t.documents for t in plan.tasks}
    assert n["cheap"] > n["dear"] > 0
    # Equal marginal z^2 per second within a rung: z^2 = s^2 n / (2 v); d z^2 / d seconds = s^2 / (2 v c).
    assert plan.seconds <= 4.0


def test_a_task_whose_extra_documents_buy_nothing_stops_at_its_checkpoint_noise():
    """A task dominated by checkpoint noise levels off; the budget goes to one whose documents still pay."""
    floor = Candidate(
        "floor", (known("floor", "acc", 0.05, 0.01, checkpoint_variance=0.01),), 10000, linear_cost(0.001)
    )
    grows = Candidate("grows", (known("grows", "acc", 0.05, 1.0),), 10000, linear_cost(0.001))
    plan = allocate([floor, grows], budget=3.05)  # 3000 documents of `grows` and a few seconds' change
    n = {t.label: t.documents for t in plan.tasks}
    assert n["grows"] == 3000 and 0 < n["floor"] <= 50


def test_missing_and_constant_tasks_are_reported_not_chosen():
    constant = figure_noise(
        "constant", "acc", [RunValues(np.arange(6) * 10, np.arange(50), np.zeros((6, 50)))]
    )
    too_few = figure_noise("few", "acc", [run_values(Truth(slope=0.01), 0, steps=(10,))])
    good = Candidate("good", (known("good", "acc", 0.05, 0.25),), 1000, linear_cost(0.001))
    plan = allocate(
        [
            good,
            Candidate("constant", (constant,), 1000, linear_cost(0.001)),
            Candidate("few", (too_few,), 1000, linear_cost(0.001)),
            Candidate("none", (), 1000, linear_cost(0.001)),
        ],
        budget=100.0,
    )
    by_label = {t.label: t for t in plan.tasks}
    assert [t.label for t in plan.kept()] == ["good"]
    assert by_label["constant"].reason.startswith("constant")
    assert by_label["few"].reason.startswith("missing")
    assert by_label["none"].reason.startswith("missing")


def test_a_task_too_dear_for_the_budget_says_so():
    plan = allocate(
        [Candidate("dear", (known("dear", "acc", 0.05, 0.25),), 1000, linear_cost(10.0))], budget=50.0
    )
    assert not plan.kept() and plan.tasks[0].reason == (
        "budget: its first 10 documents cost 100.00 s, more than the 50.00 s for tasks"
    )


def test_the_greedy_objective_is_close_to_the_best_of_every_combination_of_rungs():
    """Against exhaustive search over the ladders of three tasks with shared-prefix (concave) costs."""
    rng = np.random.default_rng(3)
    candidates = []
    for i in range(3):
        rungs = (10, 15, 20, 30, 40, 50, 75, 100, 150, 200)
        per_doc = rng.uniform(0.005, 0.02)
        seconds = tuple(0.2 + per_doc * n**0.9 for n in rungs)
        noise = known(f"t{i}", "acc", rng.uniform(0.02, 0.08), rng.uniform(0.1, 0.3), rng.uniform(0, 1e-4))
        candidates.append(Candidate(f"t{i}", (noise,), 200, CostCurve(rungs, seconds)))
    budget = 3.0
    greedy = allocate(candidates, budget)
    options = [[0, *c.ladder()] for c in candidates]
    best = 0.0
    for choice in itertools.product(*options):
        seconds = sum(c.cost(n) for c, n in zip(candidates, choice, strict=True))
        if seconds <= budget:
            best = max(best, sum(c.best(n)[1] for c, n in zip(candidates, choice, strict=True)))
    assert greedy.seconds <= budget
    assert greedy.objective >= 0.9 * best


def test_the_decision_accuracy_is_phi_of_the_combined_z():
    assert decision_accuracy(0.0) == 0.5
    assert decision_accuracy(1.96**2) == pytest.approx(0.975, abs=1e-4)
    assert decision_accuracy(4.0) == pytest.approx(0.5 * (1 + math.erf(2 / math.sqrt(2))))
