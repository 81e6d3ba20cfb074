"""The task and perplexity metrics are torchmetrics `Metric`s and work as any other: in a `MetricCollection`,
through `forward`, saved and loaded with `state_dict` mid-evaluation, merged with `merge_state`, and `reset`
to typed empty states; every result against the reference over all the data (one process, no group)."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
import torchmetrics
from metric_sync import perplexity_sequences
from metric_tester import MetricCase, assert_matches_reference, feed, random_case
from reference import FIELDS

from inloop_eval.metrics.formats import MC_METRICS
from inloop_eval.metrics.icl_metric import INT_FIELDS, ICLMetric
from inloop_eval.metrics.perplexity import perplexity_compute
from inloop_eval.metrics.perplexity_metric import PerplexityMetric
from inloop_eval.metrics.registry import ALL_METRICS

CASE = random_case("all", 11, ALL_METRICS, n_docs=24)


def halves(case: MetricCase) -> list[tuple[np.ndarray, np.ndarray]]:
    """(rows, unconditional pairs) of the first and second half of a case's documents."""
    docs = np.unique(case.rows["doc_id"])
    first = np.isin(case.rows["doc_id"], docs[: len(docs) // 2])
    u = np.arange(len(case.uncond_id))
    return [(np.flatnonzero(first), u[: len(u) // 2]), (np.flatnonzero(~first), u[len(u) // 2 :])]


def whole_perplexity() -> dict[str, float]:
    nll_S, n_tokens_S, n_bytes_S = perplexity_sequences()
    sums = {"sum_nll": float(nll_S.sum()), "n_tokens": int(n_tokens_S.sum()), "n_bytes": int(n_bytes_S.sum())}
    return {**sums, **perplexity_compute(sums["sum_nll"], sums["n_tokens"], sums["n_bytes"])}


def feed_perplexity(metric: PerplexityMetric, part: slice) -> None:
    metric.update(*(torch.from_numpy(a[part]) for a in perplexity_sequences()))


def assert_close(found: dict[str, float], expected: dict[str, float]) -> None:
    assert sorted(found) == sorted(expected)
    for key, value in expected.items():
        assert math.isclose(found[key], value, rel_tol=1e-12), key


def test_the_task_and_perplexity_metrics_are_torchmetrics_metrics():
    assert isinstance(ICLMetric(("acc",)), torchmetrics.Metric)
    assert isinstance(PerplexityMetric(), torchmetrics.Metric)


def test_a_metric_collection_of_two_task_metrics_updates_and_computes():
    collection = torchmetrics.MetricCollection({"all": ICLMetric(ALL_METRICS), "mc": ICLMetric(MC_METRICS)})
    t = torch.from_numpy
    collection.update(**{f: t(CASE.rows[f]) for f in FIELDS})
    collection.update(uncond_uid=t(CASE.uncond_id), uncond_ll=t(CASE.uncond_ll))
    found = collection.compute()
    mc_case = MetricCase("mc", CASE.rows, CASE.uncond_id, CASE.uncond_ll, MC_METRICS)
    # Figures both metrics report are told apart by the metric's name, as torchmetrics does.
    assert_matches_reference({k[4:]: v for k, v in found.items() if k.startswith("all_")}, CASE, "all")
    assert_matches_reference({k[3:]: v for k, v in found.items() if k.startswith("mc_")}, mc_case, "mc")


def test_forward_gives_the_batch_and_keeps_accumulating():
    (rows_a, uncond_a), (rows_b, uncond_b) = halves(CASE)
    metric = ICLMetric(ALL_METRICS)
    t = torch.from_numpy
    uncond = {"uncond_uid": t(CASE.uncond_id[uncond_a]), "uncond_ll": t(CASE.uncond_ll[uncond_a])}
    batch = metric(**{f: t(CASE.rows[f][rows_a]) for f in FIELDS}, **uncond)
    rows = {f: v[rows_a] for f, v in CASE.rows.items()}
    first = MetricCase("first", rows, CASE.uncond_id[uncond_a], CASE.uncond_ll[uncond_a], ALL_METRICS)
    assert_matches_reference(batch, first, "forward")
    feed(metric, CASE, rows_b, uncond_b)
    assert_matches_reference(metric.compute(), CASE, "after forward and update")


def test_state_dict_round_trip_mid_evaluation():
    (rows_a, uncond_a), (rows_b, uncond_b) = halves(CASE)
    before = ICLMetric(ALL_METRICS)
    feed(before, CASE, rows_a, uncond_a)
    ppl_before = PerplexityMetric()
    feed_perplexity(ppl_before, slice(0, 9))
    saved = io.BytesIO()
    torch.save({"icl": before.state_dict(), "ppl": ppl_before.state_dict()}, saved)
    saved.seek(0)
    loaded = torch.load(saved, weights_only=True)

    after, ppl_after = ICLMetric(ALL_METRICS), PerplexityMetric()
    after.load_state_dict(loaded["icl"])
    ppl_after.load_state_dict(loaded["ppl"])
    feed(after, CASE, rows_b, uncond_b)
    feed_perplexity(ppl_after, slice(9, None))
    assert_matches_reference(after.compute(), CASE, "loaded, then the second half")
    assert_close(ppl_after.compute(), whole_perplexity())


def test_merge_state_of_two_halves_equals_the_whole():
    (rows_a, uncond_a), (rows_b, uncond_b) = halves(CASE)
    first, second = ICLMetric(ALL_METRICS), ICLMetric(ALL_METRICS)
    feed(first, CASE, rows_a, uncond_a)
    feed(second, CASE, rows_b, uncond_b)
    first.merge_state(second)
    assert_matches_reference(first.compute(), CASE, "merged halves")

    ppl_first, ppl_second = PerplexityMetric(), PerplexityMetric()
    feed_perplexity(ppl_first, slice(0, 9))
    feed_perplexity(ppl_second, slice(9, None))
    ppl_first.merge_state(ppl_second)
    assert_close(ppl_first.compute(), whole_perplexity())


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric ICLMetric was called before")
def test_reset_leaves_typed_empty_rows_for_the_next_sync():
    """A rank that never updates after `reset` must still send int64 [0, F] and float64 [0] rows."""
    metric = ICLMetric(ALL_METRICS)
    feed(metric, CASE, *halves(CASE)[0])
    metric.reset()
    assert [(tuple(x.shape), x.dtype) for x in metric.int_rows] == [((0, len(INT_FIELDS)), torch.int64)]
    assert [(tuple(x.shape), x.dtype) for x in metric.ll] == [((0,), torch.float64)]
    assert metric.compute()["n_docs"] == 0.0


def test_update_refuses_a_negative_doc_id_and_half_an_unconditional_pair():
    metric = ICLMetric(("acc",))
    fields = {f: torch.from_numpy(CASE.rows[f][:3]) for f in FIELDS}
    fields["doc_id"] = torch.tensor([0, -1, 2])
    with pytest.raises(ValueError, match="doc_id -1 is negative"):
        metric.update(**fields)
    with pytest.raises(ValueError, match="both uncond_uid and uncond_ll"):
        metric.update(uncond_uid=torch.tensor([1]))
    with pytest.raises(ValueError, match="missing"):
        metric.update(doc_id=torch.tensor([1]))
