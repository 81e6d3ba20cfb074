"""The report's noise per task: the spread of the last evaluations around their trend."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inloop_eval.report.analysis import noise_note, trend_noise


def test_a_straight_line_has_no_noise_and_residuals_give_their_n_minus_2_deviation():
    assert trend_noise([(s, 0.3 + 0.001 * s) for s in range(0, 600, 100)]) == pytest.approx(0.0, abs=1e-12)
    rng = np.random.default_rng(0)
    steps = np.arange(0, 1000, 100)
    values = 0.25 + 1e-4 * steps + rng.normal(0, 0.02, len(steps))
    last_x, last_y = steps[-6:], values[-6:]
    residuals = last_y - np.polyval(np.polyfit(last_x, last_y, 1), last_x)
    expected = math.sqrt((residuals**2).sum() / 4)
    assert trend_noise(list(zip(steps.tolist(), values.tolist(), strict=True))) == pytest.approx(expected, rel=1e-12)


def test_too_few_evaluations_have_no_noise_and_no_note():
    assert trend_noise([(0, 0.2), (100, 0.3)]) is None
    assert noise_note({"acc": [(0, 0.2), (100, float("nan")), (200, 0.3)]}, {}) is None


def test_the_note_puts_the_noise_beside_the_binomial_stderr():
    acc = [(s, 0.3 + (0.01 if s % 200 else -0.01)) for s in range(0, 800, 100)]
    note = noise_note({"acc": acc}, {"acc": [(700, 0.016)]})
    assert note.startswith("noise: sd of the last 6 evaluations around their trend: acc 0.0")
    assert "(binomial stderr 0.016)" in note


def test_the_note_counts_the_evaluations_it_measured():
    acc = [(s, 0.3 + (0.01 if s % 200 else -0.01)) for s in range(0, 400, 100)]
    assert noise_note({"acc": acc}, {}).startswith("noise: sd of the last 4 evaluations around their trend: acc")
    longer = [(s, 0.3 + (0.01 if s % 200 else -0.01)) for s in range(0, 800, 100)]
    note = noise_note({"acc": acc, "acc_norm": longer}, {})
    assert " over 4" in note and " over 6" in note
