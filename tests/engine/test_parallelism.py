"""The evaluator with a data-parallel group and a tensor-parallel model, under real process groups (torchrun,
gloo on CPU): DP x TP splits of 2 and 4 processes give the figures of one process, peers of a model-parallel
group score the same documents, a vocabulary-sharded head gives the unsharded model's numbers without
allocating more than [U, V/TP] in scoring, a Llama-style model under torchtitan's whole tensor-parallel plan
gives its unsharded numbers, and sharding over no group or the wrong one is refused.

One launch per world size runs the checks of tests/support/workers/parallel_checks.py; world size 1
runs them in this process without a process group (the reference).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from helpers import assert_same_metrics
from workers import parallel_checks
from workers.launch import REPO, launch, read_ranks, worker_env

from inloop_eval.distributed import check_data_parallel, resolve_data_parallel
from inloop_eval.errors import ConfigError

LAUNCHES: dict[int, list[str]] = {2: ["layouts", "vocab_tp", "torchtitan_plan", "registered_layout"], 4: ["layouts"]}
LAUNCH_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def single(data_root: Path, tmp_path_factory) -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INLOOP_EVAL_HOME", str(tmp_path_factory.mktemp("home1")))
        return parallel_checks.run_checks(["layouts", "vocab_tp", "torchtitan_plan", "registered_layout"], data_root)


@pytest.fixture(scope="module")
def launched(data_root: Path, tmp_path_factory) -> dict[int, list[dict[str, Any]]]:
    """World size -> every rank's results, one launch each."""
    out: dict[int, list[dict[str, Any]]] = {}
    for nproc, checks in LAUNCHES.items():
        folder = tmp_path_factory.mktemp(f"ws{nproc}")
        args = [str(REPO / "tests" / "support" / "workers" / "parallel_checks.py"), "--data-root", str(data_root)]
        args += ["--out", str(folder), "--checks", ",".join(checks)]
        launch(nproc, args, timeout=LAUNCH_TIMEOUT_S, env=worker_env(INLOOP_EVAL_HOME=str(folder / "home")))
        out[nproc] = read_ranks(folder, nproc)
    return out


def test_data_parallel_splits_give_the_figures_of_one_process(single, launched) -> None:
    reference = single["layouts"]["reference"]["metrics"]
    found = []
    for nproc, ranks in launched.items():
        for rank, result in enumerate(ranks):
            for layout, value in result["layouts"].items():
                assert_same_metrics(value["metrics"], reference, f"{nproc} processes {layout} rank {rank}", 1e-6)
                found.append(layout)
    assert {"dp2xtp1", "dp1xtp2", "dp2xtp2", "dp2xtp2_group"} <= set(found)


def test_model_parallel_peers_score_the_same_documents(launched) -> None:
    # Mesh (dp, tp) = (2, 2): ranks 0 and 1 are tensor-parallel peers, as are 2 and 3.
    rows = launched[4][0]["layouts"]["dp2xtp2"]["rows"]
    assert rows[0] == rows[1] and rows[2] == rows[3]
    one_replica = launched[2][0]["layouts"]["dp1xtp2"]["rows"]
    assert one_replica[0] == one_replica[1]
    for task, every_row in one_replica[0].items():
        # The two data-parallel ranks share the documents out (the sampler repeats one to even them).
        assert rows[0][task] != rows[2][task], task
        assert set(rows[0][task]) | set(rows[2][task]) == set(every_row), task


@pytest.mark.parametrize("path", ["hidden", "logits"])
def test_vocabulary_sharded_head_gives_the_unsharded_numbers(single, launched, path: str) -> None:
    reference = single["vocab_tp"][path]
    expected = {(s["task"], s["doc_id"], s["cont_id"]): s for s in reference["samples"]}
    for rank, result in enumerate(launched[2]):
        found = result["vocab_tp"][path]
        assert_same_metrics(found["metrics"], reference["metrics"], f"rank {rank}", 1e-5)
        # One data-parallel rank: each tensor-parallel peer scores every request.
        assert len(found["samples"]) == len(expected)
        for s in found["samples"]:
            ref = expected[(s["task"], s["doc_id"], s["cont_id"])]
            assert s["is_greedy"] == ref["is_greedy"], s
            assert math.isclose(s["ll"], ref["ll"], rel_tol=1e-5, abs_tol=1e-5), (s, ref)
            if ref["ll_uncond"] is not None:
                assert math.isclose(s["ll_uncond"], ref["ll_uncond"], rel_tol=1e-5, abs_tol=1e-5), (s, ref)


def test_torchtitans_tensor_parallel_plan_gives_the_unsharded_numbers(single, launched) -> None:
    """A Llama-style model under torchtitan's whole plan (column/row-parallel attention and MLP, sequence-
    parallel norms and residual stream, vocabulary-sharded output) at TP=2 equals it unsharded."""
    reference = single["torchtitan_plan"]
    expected = {(s["task"], s["doc_id"], s["cont_id"]): s for s in reference["samples"]}
    for rank, result in enumerate(launched[2]):
        found = result["torchtitan_plan"]
        assert_same_metrics(found["metrics"], reference["metrics"], f"rank {rank}", 1e-5)
        assert_same_samples(found["samples"], expected)


@pytest.mark.parametrize("path", ["hidden", "logits"])
def test_vocabulary_sharded_scoring_allocates_at_most_a_slice(launched, path: str) -> None:
    """The largest tensor `token_logprobs` allocates is at most [U, V/TP] (U positions scored)."""
    for result in launched[2]:
        record = result["vocab_tp"][path]["memory"]
        assert record
        assert all(r["largest"] <= r["bound"] for r in record), max(record, key=lambda r: r["largest"] / r["bound"])


def assert_same_samples(samples: list[dict[str, Any]], expected: dict[tuple[str, int, int], dict[str, Any]]) -> None:
    """Every request scored, each with the reference's greedy flag and loglikelihood (1e-5)."""
    assert len(samples) == len(expected)
    for s in samples:
        ref = expected[(s["task"], s["doc_id"], s["cont_id"])]
        assert s["is_greedy"] == ref["is_greedy"], s
        assert math.isclose(s["ll"], ref["ll"], rel_tol=1e-5, abs_tol=1e-5), (s, ref)


def test_a_layout_registered_from_outside_the_package_gives_the_unsharded_numbers(single, launched) -> None:
    """A toy model returning its vocabulary in slices over two ranks, registered with `register_model_family` from
    this test's support code (no edit of the engine), scores as the same model unsharded."""
    reference = single["registered_layout"]
    expected = {(s["task"], s["doc_id"], s["cont_id"]): s for s in reference["samples"]}
    for rank, result in enumerate(launched[2]):
        found = result["registered_layout"]
        assert_same_metrics(found["metrics"], reference["metrics"], f"rank {rank}", 1e-5)
        assert_same_samples(found["samples"], expected)


def test_sharding_over_no_group_or_the_wrong_group_is_refused(launched) -> None:
    for result in launched[2]:
        assert "no data-parallel group was given" in result["vocab_tp"]["no_group"]
        assert "dp_group=" in result["vocab_tp"]["no_group"]
        assert "splits the peers of the model-parallel dimension ['tp']" in result["vocab_tp"]["world_group"]


def test_a_data_parallel_group_must_be_a_group_or_a_mesh() -> None:
    with pytest.raises(ConfigError, match="ProcessGroup or DeviceMesh"):
        resolve_data_parallel("dp")  # type: ignore[arg-type]
    assert resolve_data_parallel(None) is None


def test_a_model_without_dtensor_parameters_needs_no_group() -> None:
    assert not dist.is_initialized()
    check_data_parallel(parallel_checks.tiny_gpt(), None)  # joins no collective: no process group here
