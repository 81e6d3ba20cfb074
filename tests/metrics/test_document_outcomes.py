"""Per-document outcomes: the values each logged figure is the mean of, exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from metric_tester import random_case

from inloop_eval.metrics.icl import WHOLE_FIGURE_NOTE, icl_evaluate
from inloop_eval.metrics.icl_metric import ICLMetric
from inloop_eval.metrics.registry import ALL_METRICS, METRICS, canonical


def evaluate_case(seed: int, metrics: tuple[str, ...]):
    case = random_case(f"case{seed}", seed, metrics, n_docs=40)
    t = torch.as_tensor
    requests = {name: t(values) for name, values in case.rows.items()}
    return case, icl_evaluate(requests, t(case.uncond_id), t(case.uncond_ll), metrics)


@pytest.mark.parametrize("seed", range(6))
def test_the_mean_of_the_per_document_values_is_the_logged_figure_exactly(seed):
    _, (figures, outcomes) = evaluate_case(seed, ALL_METRICS)
    assert len(outcomes.doc_id) == len(outcomes.n_choices) == figures["n_docs"]
    assert np.all(np.diff(outcomes.doc_id) > 0)
    for name in ALL_METRICS:
        definition = METRICS[canonical(name)]
        if definition.kind == "whole":
            assert name not in outcomes.values and outcomes.left_out[name] == WHOLE_FIGURE_NOTE
            continue
        values = outcomes.values[name]
        assert values.dtype == np.float64 and values.shape == outcomes.doc_id.shape
        assert float(torch.as_tensor(values).mean()) == figures[name], name
        assert (name in outcomes.binary) == definition.binary
        if definition.binary:
            assert set(np.unique(values)) <= {0.0, 1.0}


def test_the_per_document_values_are_those_of_the_complete_documents():
    case, (figures, outcomes) = evaluate_case(3, ("acc", "ce_gold"))
    counts = {}
    for doc, k, ll in zip(case.rows["doc_id"], case.rows["n_choices"], case.rows["ll"], strict=True):
        seen, expected, finite = counts.get(int(doc), (0, int(k), True))
        counts[int(doc)] = (seen + 1, expected, finite and bool(np.isfinite(ll)))
    complete = sorted(d for d, (seen, k, finite) in counts.items() if seen == k and finite)
    assert outcomes.doc_id.tolist() == complete
    assert outcomes.n_choices.tolist() == [counts[d][1] for d in complete]
    assert figures["n_skipped_docs"] == len(counts) - len(complete)


def test_the_metric_keeps_the_outcomes_of_its_latest_compute_and_names_olmo_figures_left_out():
    case = random_case("olmo", 1, ("acc",), n_docs=12)
    # OLMo's figures need exactly one gold and every request: keep the documents that have them.
    metric = ICLMetric(("acc", "f1"), olmo_metric_type="acc")
    t = torch.from_numpy
    good = []
    for doc in np.unique(case.rows["doc_id"]):
        rows = np.flatnonzero(case.rows["doc_id"] == doc)
        k = case.rows["n_choices"][rows[0]]
        if len(rows) == k and case.rows["is_gold"][rows].sum() == 1 and np.isfinite(case.rows["ll"][rows]).all():
            good.extend(rows.tolist())
    good = np.asarray(good)
    metric.update(**{f: t(np.ascontiguousarray(v[good])) for f, v in case.rows.items()})
    metric.update_uncond(t(case.uncond_id), t(case.uncond_ll))
    figures = metric.compute()
    outcomes = metric.outcomes
    assert outcomes is not None and float(outcomes.values["acc"].mean()) == figures["acc"]
    assert "f1" in outcomes.left_out and "acc_v1" in outcomes.left_out
