"""The metrics synced by torchmetrics on real gloo ranks (tests/support/metric_sync.py): a task in two gathered
states (one per dtype) and a perplexity label in one all-reduce, every rank the figures of all the data, with ranks
holding different numbers of rows and a rank that never updates; alone in a process group, a metric with
`sync_on_compute=False` (as the evaluators make it for a data-parallel group of one) gathers nothing and
computes from its own rows."""

from __future__ import annotations

import math

import pytest
from metric_sync import LABELS, SyncJob, holders, perplexity_sequences
from metric_tester import MetricCase, assert_matches_reference, random_case, run_job_in_processes

from inloop_eval.metrics.perplexity import perplexity_compute
from inloop_eval.metrics.registry import ALL_METRICS

CASE = random_case("sync", 7, ALL_METRICS, n_docs=20, empty_last_rank=True, update_when_empty=False)


@pytest.fixture(scope="module")
def ranks() -> dict[int, list[dict]]:
    """World size -> every rank's `SyncJob` results."""
    return {world_size: run_job_in_processes(SyncJob(CASE), world_size) for world_size in (1, 3)}


def expected_perplexity(world_size: int, label: int | None = None, rank: int | None = None) -> dict[str, float]:
    """The sums and figures of every sequence the holding ranks were dealt (of one `label` of LABELS, and of
    one `rank`'s share, where given)."""
    nll_S, n_tokens_S, n_bytes_S = (a if label is None else a[label::LABELS] for a in perplexity_sequences())
    n_holders = holders(CASE, world_size)
    dealt = [i for r in range(n_holders) if rank in (None, r) for i in range(r, len(nll_S), n_holders)]
    sums = {
        "sum_nll": float(nll_S[dealt].sum()),
        "n_tokens": int(n_tokens_S[dealt].sum()),
        "n_bytes": int(n_bytes_S[dealt].sum()),
    }
    return {**sums, **perplexity_compute(sums["sum_nll"], sums["n_tokens"], sums["n_bytes"])}


def assert_perplexity(found: dict[str, float], expected: dict[str, float], where: str) -> None:
    assert sorted(found) == sorted(expected), where
    assert (found["n_tokens"], found["n_bytes"]) == (expected["n_tokens"], expected["n_bytes"]), where
    for key in ("sum_nll", "ce", "ppl", "bpb"):
        assert math.isclose(found[key], expected[key], rel_tol=1e-12), f"{where}: {key}"


def test_three_ranks_of_different_lengths_and_one_that_never_updates_give_every_rank_the_whole(ranks):
    rows = [len(r) for r, _ in CASE.shard(3)]
    assert rows[0] != rows[1] and rows[2] == 0  # the case is what the test says it is
    for rank, out in enumerate(ranks[3]):
        assert_matches_reference(out["icl"], CASE, f"world size 3 rank {rank}")
        assert_perplexity(out["ppl"], expected_perplexity(3), f"world size 3 rank {rank}")


def test_a_task_gathers_two_states_and_a_perplexity_label_syncs_in_one_all_reduce(ranks):
    for rank, out in enumerate(ranks[3]):
        assert (out["icl_states_gathered"], out["ppl_collectives"]) == (2, 1), rank
        assert out["icl_keeps_its_own_rows"], rank  # synced states are put back: it can keep accumulating
        assert out["ppl_keeps_its_own_sums"], rank  # its own sums put back after the all-reduce


def test_labels_sync_together_in_one_all_reduce_and_keep_their_own_sums(ranks):
    for world_size, collectives in ((3, 1), (1, 0)):
        for rank, out in enumerate(ranks[world_size]):
            where = f"world size {world_size} rank {rank}"
            assert out["labels_collectives"] == collectives, where
            for label in range(LABELS):
                assert_perplexity(out["labels"][label], expected_perplexity(world_size, label), f"{where} label {label}")
                own = expected_perplexity(world_size, label, rank) if rank < holders(CASE, world_size) else None
                own_sums = [own["sum_nll"], own["n_tokens"], own["n_bytes"]] if own else [0.0, 0.0, 0.0]
                assert out["labels_keep_their_own_sums"][label] == pytest.approx(own_sums, rel=1e-12), where


def test_without_sync_each_rank_computes_its_own_rows(ranks):
    for rank, out in enumerate(ranks[3]):
        rows, uncond = CASE.shard(3)[rank]
        own = {f: v[rows] for f, v in CASE.rows.items()}
        own_case = MetricCase("own", own, CASE.uncond_id[uncond], CASE.uncond_ll[uncond], CASE.metrics)
        assert out["icl_unsynced_states_gathered"] == 0, rank
        assert_matches_reference(out["icl_unsynced"], own_case, f"world size 3 rank {rank} without sync")


def test_alone_in_a_process_group_no_sync_gathers_nothing_and_gives_the_same_figures(ranks):
    (alone,) = ranks[1]
    assert alone["icl_states_gathered"] == 2  # torchmetrics syncs a group of one unless told not to
    assert alone["icl_unsynced_states_gathered"] == 0
    assert alone["icl_unsynced_keeps_its_own_rows"]
    assert_matches_reference(alone["icl_unsynced"], CASE, "world size 1 without sync")
    assert_matches_reference(alone["icl"], CASE, "world size 1 with sync")
    assert_perplexity(alone["ppl"], expected_perplexity(1), "world size 1")
