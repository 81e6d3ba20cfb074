"""Signal-to-noise across runs: relative dispersion of final scores over relative checkpoint noise."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inloop_eval.report.analysis import trend_noise
from inloop_eval.report.runs import RunHistory
from inloop_eval.report.signal import bpb_suggestion, signal_to_noise

STEPS = list(range(0, 1000, 100))


def history(seed: int, level: float, jitter: float, bpb: float | None = None) -> RunHistory:
    rng = np.random.default_rng(seed)
    # Checkpoint noise that alternates: every run ends on the same side, so its level decides its final.
    acc = [
        (s, level + 1e-5 * s + jitter * (-1) ** i + float(rng.normal(0, jitter / 10)))
        for i, s in enumerate(STEPS)
    ]
    series = {"eval/downstream/piqa/acc": acc}
    if bpb is not None:
        series["eval/downstream/piqa/bpb_gold"] = [
            (s, bpb - 1e-5 * s + float(rng.normal(0, 1e-4))) for s in STEPS
        ]
    return RunHistory(series)


def test_signal_noise_and_snr_follow_the_definition():
    runs = [history(0, 0.60, 0.01), history(1, 0.64, 0.01), history(2, 0.62, 0.01)]
    (found,) = signal_to_noise(runs)
    finals = [r.series["eval/downstream/piqa/acc"][-1][1] for r in runs]
    signal = (max(finals) - min(finals)) / abs(np.mean(finals))
    noises = []
    for r in runs:
        points = r.series["eval/downstream/piqa/acc"]
        noises.append(trend_noise(points) / abs(np.mean([v for _, v in points[-6:]])))
    assert found.finals == pytest.approx(finals)
    assert found.signal == pytest.approx(signal, rel=1e-12)
    assert found.noise == pytest.approx(np.mean(noises), rel=1e-12)
    assert found.snr == pytest.approx(signal / np.mean(noises), rel=1e-12)


def test_one_run_has_no_signal():
    assert signal_to_noise([history(0, 0.6, 0.01)]) == []


def test_runs_within_their_noise_are_flagged_with_their_bpb_twin():
    runs = [history(0, 0.60, 0.03, bpb=1.20), history(1, 0.601, 0.03, bpb=1.10)]
    signals = {s.figure: s for s in signal_to_noise(runs)}
    assert signals["acc"].noisy and not signals["bpb_gold"].noisy
    sentence = bpb_suggestion(list(signals.values()))["piqa"]
    assert sentence.startswith("noise exceeds signal on acc; its bpb_gold has SNR")


def test_without_a_bpb_twin_the_flag_says_to_log_it():
    signals = signal_to_noise([history(0, 0.60, 0.03), history(1, 0.601, 0.03)])
    assert "log its bits-per-byte twin" in bpb_suggestion(signals)["piqa"]


def test_clearly_separated_runs_are_not_flagged():
    signals = signal_to_noise([history(0, 0.50, 0.002), history(1, 0.70, 0.002)])
    assert signals[0].snr > 10 and bpb_suggestion(signals) == {}


def test_too_few_evaluations_leave_the_noise_undefined():
    short = [RunHistory({"eval/downstream/piqa/acc": [(0, 0.5), (100, v)]}) for v in (0.6, 0.7)]
    (found,) = signal_to_noise(short)
    assert math.isnan(found.noise) and math.isnan(found.snr) and not found.noisy


def noisy_pair_with_twin(twin_jitter: float) -> list:
    """Two runs within their acc noise, with a bpb twin as noisy as `twin_jitter` makes it."""
    runs = []
    for seed, (level, bpb) in enumerate(((0.60, 1.20), (0.601, 1.19))):
        run = history(seed, level, 0.03)
        run.series["eval/downstream/piqa/bpb_gold"] = [
            (s, bpb + twin_jitter * (-1) ** i) for i, s in enumerate(STEPS)
        ]
        runs.append(run)
    return runs


def test_a_bpb_twin_noisier_than_the_flagged_figure_is_not_advised():
    signals = {s.figure: s for s in signal_to_noise(noisy_pair_with_twin(0.5))}
    assert signals["acc"].noisy and signals["bpb_gold"].snr < signals["acc"].snr
    sentence = bpb_suggestion(list(signals.values()))["piqa"]
    assert "compare runs on bpb_gold" not in sentence
    assert "no less noisy" in sentence and f"{signals['bpb_gold'].snr:.2f}" in sentence


def test_a_bpb_twin_quieter_than_the_flagged_figure_is_advised():
    signals = {s.figure: s for s in signal_to_noise(noisy_pair_with_twin(1e-4))}
    assert signals["bpb_gold"].snr > signals["acc"].snr
    assert "compare runs on bpb_gold" in bpb_suggestion(list(signals.values()))["piqa"]


def test_runs_of_different_lengths_are_compared_at_their_last_common_step():
    long = RunHistory({"eval/downstream/piqa/acc": [(s, 0.5 + s / 1000) for s in (0, 50, 100, 150)]})
    short = RunHistory({"eval/downstream/piqa/acc": [(s, 0.4 + s / 1000) for s in (0, 50)]})
    (found,) = signal_to_noise([long, short])
    assert found.steps == (50, 50)
    assert found.finals == pytest.approx((0.55, 0.45))


def test_runs_sharing_no_step_keep_each_run_s_own_last_step():
    a = RunHistory({"eval/downstream/piqa/acc": [(100, 0.5), (150, 0.6)]})
    b = RunHistory({"eval/downstream/piqa/acc": [(10, 0.4), (50, 0.45)]})
    (found,) = signal_to_noise([a, b])
    assert found.steps == (150, 50) and found.finals == pytest.approx((0.6, 0.45))
