"""A task figure's noise and signal, estimated from synthetic outcomes whose parts are known, and the
arithmetic against plain NumPy references (a two-way ANOVA by least squares, a line by lstsq)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from plan_outcomes import Truth, run_values

from inloop_eval.plan.noise import CHECKPOINT_UNSEEN, RunValues, figure_noise, interaction_variance, trend


def anova_residual_reference(values_KD: np.ndarray) -> float:
    """The residual variance of an additive model (one effect per row, one per column) fitted by least
    squares on a dummy design matrix."""
    k, d = values_KD.shape
    rows = np.repeat(np.eye(k), d, axis=0)
    cols = np.tile(np.eye(d), (k, 1))
    design = np.hstack([rows, cols[:, 1:]])  # one column dropped: the model has k + d - 1 parameters
    y = values_KD.reshape(-1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ coef
    return float(residual @ residual / (k * d - (k + d - 1)))


def test_the_interaction_variance_is_an_additive_models_residual_variance():
    values_KD = np.random.default_rng(0).normal(size=(5, 7)) + np.arange(7)[None, :] + np.arange(5)[:, None]
    assert interaction_variance(values_KD) == pytest.approx(anova_residual_reference(values_KD), rel=1e-12)


def test_the_trend_is_a_least_squares_line_with_its_slopes_variance():
    rng = np.random.default_rng(1)
    steps = np.array([0, 10, 20, 40, 50, 70])
    means = 0.5 + 0.01 * steps + rng.normal(0, 0.02, len(steps))
    slope, slope_variance, residual = trend(steps, means)
    design = np.stack([steps, np.ones(len(steps))], axis=1).astype(float)
    coef, *_ = np.linalg.lstsq(design, means, rcond=None)
    sigma2 = float(((means - design @ coef) ** 2).sum() / (len(steps) - 2))
    covariance = sigma2 * np.linalg.inv(design.T @ design)
    assert slope == pytest.approx(coef[0], rel=1e-10)
    assert residual == pytest.approx(sigma2, rel=1e-10)
    assert slope_variance == pytest.approx(covariance[0, 0], rel=1e-10)


def test_one_run_recovers_the_per_document_and_checkpoint_variances_and_the_trend():
    truth = Truth(slope=0.002, doc_sd=0.2, checkpoint_sd=0.01)
    estimates = [figure_noise("t", "bpb_gold", [run_values(truth, seed, n_docs=400)]) for seed in range(300)]
    assert all(e.problem == "" and e.source == "trend" for e in estimates)
    assert np.mean([e.doc_variance for e in estimates]) == pytest.approx(truth.doc_sd**2, rel=0.02)
    # The checkpoint part is a variance less a variance over 4 degrees of freedom, clipped at 0: unbiased
    # only on average and loosely.
    assert np.mean([e.checkpoint_variance for e in estimates]) == pytest.approx(
        truth.checkpoint_sd**2, rel=0.25
    )
    change = truth.slope * 10  # the trend's change from one evaluation to the next
    assert np.sqrt(np.mean([e.signal**2 for e in estimates])) == pytest.approx(change, rel=0.1)


def test_the_noise_of_n_documents_is_the_per_document_part_over_n_plus_the_checkpoint_part():
    e = figure_noise("t", "acc", [run_values(Truth(slope=0.01, doc_sd=0.3, checkpoint_sd=0.02), 0)])
    for n in (10, 100, 1000):
        checkpoint = max(e.checkpoint_variance, e.checkpoint_floor)
        assert e.variance(n) == pytest.approx(e.doc_variance / n + checkpoint)
        assert e.z2(n) == pytest.approx(e.signal**2 / (2 * e.variance(n)))
    assert e.z2(1000) > e.z2(100) > e.z2(10)
    assert e.z2(10**9) == pytest.approx(e.signal**2 / (2 * checkpoint), rel=1e-5)


def test_the_plan_counts_checkpoint_noise_the_runs_could_not_rule_out():
    """With no checkpoint noise at all, 6 evaluations of 300 documents cannot tell it from a residual's
    standard error: z^2 levels off at signal^2 / (2 x that floor) rather than growing without end."""
    e = figure_noise("t", "acc", [run_values(Truth(slope=0.003, doc_sd=0.3), 0, n_docs=300)])
    residual = e.doc_variance / 300 + e.checkpoint_variance
    assert e.checkpoint_floor > 0
    assert e.checkpoint_floor == pytest.approx(math.sqrt(2 / 4) * residual, rel=0.5)
    assert e.z2(10**9) == pytest.approx(
        e.signal**2 / (2 * max(e.checkpoint_floor, e.checkpoint_variance)), rel=1e-5
    )


def test_the_levels_standard_error_matches_fresh_samples_of_the_split():
    """Predicted: sqrt(S^2 / n x (N - n) / N), S^2 the split's variance with N - 1 degrees of freedom; observed: the spread of means of 4000 samples of n
    documents drawn without replacement from the split (a plain NumPy simulation)."""
    run = run_values(Truth(slope=0.0, doc_sd=0.2, spread=0.5), 0, n_docs=2000)
    e = figure_noise("t", "bpb_gold", [run])
    rng = np.random.default_rng(5)
    population = run.values_KD[-1]
    for n in (50, 500):
        means = [population[rng.choice(len(population), n, replace=False)].mean() for _ in range(4000)]
        assert e.stderr(n, len(population)) == pytest.approx(float(np.std(means)), rel=0.06)


def test_a_flat_noisy_curve_shows_little_signal_and_a_trend_shows_it():
    flat = [figure_noise("t", "acc", [run_values(Truth(doc_sd=0.3), seed)]) for seed in range(200)]
    rising = [
        figure_noise("t", "acc", [run_values(Truth(slope=0.002, doc_sd=0.3), seed)]) for seed in range(200)
    ]
    assert np.median([e.z2(200) for e in flat]) < 0.2
    assert np.median([e.z2(200) for e in rising]) > 5 * max(np.median([e.z2(200) for e in flat]), 0.01)


def test_several_runs_take_their_spread_as_the_signal_and_their_paired_differences_as_the_noise():
    offsets = (0.0, 0.05, 0.10, 0.15)
    runs = [run_values(Truth(doc_sd=0.2, offset=o), seed) for seed, o in enumerate(offsets)]
    e = figure_noise("t", "bpb_gold", runs)
    assert e.source == "4 runs"
    pairs = [(a - b) ** 2 for i, a in enumerate(offsets) for b in offsets[i + 1 :]]
    assert e.signal == pytest.approx(math.sqrt(np.mean(pairs)), rel=0.15)
    # x_a - x_b of one document has twice the per-document variance.
    assert e.doc_variance == pytest.approx(0.2**2, rel=0.15)


def test_two_evaluations_give_the_change_and_the_per_document_variance_with_checkpoint_noise_unseen():
    """With two evaluations no line has a residual: the change between them (its square less the sampling
    variance of a difference of two means on the same documents) against a NumPy reference, the per-document
    variance recovered, and the checkpoint noise counted as 0, said in the source."""
    truth = Truth(slope=0.002, doc_sd=0.2)
    estimates = []
    for seed in range(300):
        run = run_values(truth, seed, n_docs=400, steps=(0, 10))
        e = figure_noise("t", "bpb_gold", [run])
        diff_D = run.values_KD[1] - run.values_KD[0]
        reference = max(diff_D.mean() ** 2 - diff_D.var(ddof=1) / len(diff_D), 0.0)  # var(mean of diff)
        assert e.signal**2 == pytest.approx(reference, rel=1e-9, abs=1e-15)
        assert e.doc_variance == pytest.approx(diff_D.var(ddof=1) / 2, rel=1e-9)
        assert e.source == CHECKPOINT_UNSEEN and e.checkpoint_variance == 0.0 and e.checkpoint_floor == 0.0
        estimates.append(e)
    assert np.mean([e.doc_variance for e in estimates]) == pytest.approx(truth.doc_sd**2, rel=0.02)
    assert np.sqrt(np.mean([e.signal**2 for e in estimates])) == pytest.approx(truth.slope * 10, rel=0.1)


def test_missing_and_constant_figures_are_reported_with_the_reason():
    too_few = run_values(Truth(slope=0.01), 0, steps=(10,))
    assert figure_noise("t", "acc", [too_few]).problem.startswith("missing")
    constant = RunValues(np.arange(5) * 10, np.arange(30), np.ones((5, 30)))
    e = figure_noise("t", "acc", [constant])
    assert e.problem.startswith("constant") and e.z2(100) == 0.0


def test_runs_that_do_not_differ_show_no_signal_between_them():
    """Four runs of one quality: their spread is their evaluations' noise, which the signal discounts."""
    z2 = []
    for trial in range(100):
        runs = [run_values(Truth(doc_sd=0.2), 1000 * trial + seed) for seed in range(4)]
        z2.append(figure_noise("t", "bpb_gold", runs).z2(200))
    assert np.median(z2) < 0.1
    assert sum(z == 0.0 for z in z2) > 30  # the spread falls within two evaluations' noise


def test_the_between_runs_parts_against_a_plain_numpy_reference():
    """Pairs compared on the documents both scored at the last step all runs share."""
    runs = [
        run_values(
            Truth(doc_sd=0.2, offset=0.1 * i),
            i,
            n_docs=60 + 10 * i,
            steps=(0, 10, 20, 30, 40, 50 + 10 * (i == 0)),
        )
        for i in range(3)
    ]
    squares, halves = [], []
    for a in range(3):
        for b in range(a + 1, 3):
            ra, rb = runs[a], runs[b]
            ka = list(ra.steps_K).index(40)
            kb = list(rb.steps_K).index(40)
            n = min(len(ra.doc_id_D), len(rb.doc_id_D))  # ids 0..n-1 are the shared documents
            diff = ra.values_KD[ka, :n] - rb.values_KD[kb, :n]
            squares.append(diff.mean() ** 2)
            halves.append(diff.var(ddof=1) / 2)
    e = figure_noise("t", "bpb_gold", runs)
    assert e.doc_variance == pytest.approx(np.mean(halves), rel=1e-12)
    noise = np.mean(halves) / 60 + e.checkpoint_variance
    assert e.signal == pytest.approx(math.sqrt(max(np.mean(squares) - 2 * noise, 0.0)), rel=1e-12)


def test_a_curve_bending_like_a_power_law_is_not_counted_as_checkpoint_noise():
    """bpb falling as a line in log(1 + step), early in training: a line in the step would leave the bend as
    residual; the trend in the logarithm leaves only the documents' noise."""
    steps_K = np.array([6, 12, 18, 24, 30, 36])
    rng = np.random.default_rng(0)
    values_KD = (
        3.5 - 0.4 * np.log1p(steps_K)[:, None] + rng.normal(0, 0.3, (1, 300)) + rng.normal(0, 0.05, (6, 300))
    )
    e = figure_noise("t", "bpb_gold", [RunValues(steps_K, np.arange(300), values_KD)])
    _, _, straight_residual = trend(steps_K, values_KD.mean(1))
    assert straight_residual > 100 * e.checkpoint_variance
    assert e.checkpoint_variance < 1e-4


def test_one_runs_loss_spike_is_not_every_runs_checkpoint_noise():
    runs = [run_values(Truth(doc_sd=0.2, offset=0.1 * i), i) for i in range(5)]
    spiked = runs[0].values_KD.copy()
    spiked[2] += 2.0
    calm = figure_noise("t", "bpb_gold", runs)
    runs[0] = RunValues(runs[0].steps_K, runs[0].doc_id_D, spiked)
    with_spike = figure_noise("t", "bpb_gold", runs)
    assert with_spike.checkpoint_variance < 2 * calm.checkpoint_variance + 1e-4
    assert with_spike.signal > 0.5 * calm.signal
