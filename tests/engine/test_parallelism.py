"""The evaluator with a data-parallel group and a tensor-parallel or pipelined model, under real process groups
(torchrun, gloo on CPU).

Tensor parallel: DP x TP splits of 2 and 4 processes give the figures of one process, peers of a
model-parallel group score the same documents, a vocabulary-sharded head gives the unsharded model's numbers
without allocating more than [U, V/TP] in scoring, a Llama-style model under torchtitan's whole
tensor-parallel plan gives its unsharded numbers, and sharding over no group or the wrong one is refused.

Pipeline (`PipelineAdapter` over torch's schedules): PP=2 (2 processes) and DP=2 x PP=2 (4) give the figures
of the unsplit model in one process, downstream (rc, letter-key, PMI) and perplexity; a last stage's scoring
error reaches every rank; training through the same schedule (1F1B, with a loss) is unchanged by
evaluations, whose first figures equal the unsplit model's; an interleaved schedule (two stages per rank)
gives the same figures; a missing or wrong data-parallel group is refused.

One launch per world size runs the checks of tests/support/workers/parallel_checks.py, the pipeline's
(tests/support/workers/pipeline_checks.py) among them as `pipeline_<check>`, so that processes start once
for both; world size 1 runs them in this process without a process group (the reference).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from helpers import assert_same_metrics
from workers import parallel_checks, pipeline_checks
from workers.launch import REPO, launch, read_ranks, worker_env

from inloop_eval.distributed import check_data_parallel, resolve_data_parallel
from inloop_eval.engine.adapters.pipeline import PipelineAdapter
from inloop_eval.errors import ConfigError

PIPELINE = "pipeline_"  # the prefix of the pipeline's checks
LAUNCHES: dict[int, list[str]] = {
    2: ["layouts", "vocab_tp", "torchtitan_plan", "registered_layout", *(PIPELINE + c for c in pipeline_checks.CHECKS)],
    4: ["layouts", PIPELINE + "layouts"],
}
LAUNCH_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def single(data_root: Path, tmp_path_factory) -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INLOOP_EVAL_HOME", str(tmp_path_factory.mktemp("home1")))
        names = ["layouts", "vocab_tp", "torchtitan_plan", "registered_layout", PIPELINE + "layouts"]
        return parallel_checks.run_checks(names, data_root)


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


def pipeline_only(results: dict[str, Any]) -> dict[str, Any]:
    """The pipeline's checks of `results`, under their own names."""
    return {name.removeprefix(PIPELINE): value for name, value in results.items() if name.startswith(PIPELINE)}


@pytest.fixture(scope="module")
def pipeline_single(single) -> dict[str, Any]:
    """The unsplit model in this process: the pipeline checks' reference."""
    return pipeline_only(single)["layouts"]


@pytest.fixture(scope="module")
def pipeline_launched(launched) -> dict[int, list[dict[str, Any]]]:
    """World size -> every rank's results of the pipeline's checks."""
    return {nproc: [pipeline_only(result) for result in ranks] for nproc, ranks in launched.items()}


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


# ---- pipeline parallelism -----------------------------------------------------------------------------


def test_pipeline_layouts_give_the_figures_of_one_process(pipeline_single, pipeline_launched) -> None:
    reference = pipeline_single["reference"]["metrics"]
    assert (
        any(k.startswith("eval/lm/") for k in reference) and "eval/downstream/arc_easy/acc_pmi" in reference
    )
    for nproc, ranks in pipeline_launched.items():
        for rank, result in enumerate(ranks):
            assert_same_metrics(
                result["layouts"]["metrics"], reference, f"{nproc} processes rank {rank}", 1e-5
            )


def test_an_interleaved_schedule_with_two_stages_per_rank_gives_the_same_figures(pipeline_single, pipeline_launched) -> None:
    """ScheduleInterleaved1F1B over 4 stages (embeddings | block | block | head), two on each rank."""
    expected = {(s["task"], s["doc_id"], s["cont_id"]): s["ll"] for s in pipeline_single["reference"]["samples"]}
    for rank, result in enumerate(pipeline_launched[2]):
        found = result["layouts"]["interleaved"]
        assert_same_metrics(
            found["metrics"], pipeline_single["reference"]["metrics"], f"interleaved rank {rank}", 1e-5
        )
        assert len(found["samples"]) == len(expected)
        for s in found["samples"]:
            ll = expected[(s["task"], s["doc_id"], s["cont_id"])]
            assert math.isclose(s["ll"], ll, rel_tol=1e-5, abs_tol=1e-5), (s, ll)


def test_every_stage_gets_the_last_stages_scores_of_each_request(pipeline_single, pipeline_launched) -> None:
    expected = {(s["task"], s["doc_id"], s["cont_id"]): s for s in pipeline_single["reference"]["samples"]}
    for ranks in pipeline_launched.values():
        per_rank = [
            {(s["task"], s["doc_id"], s["cont_id"]): s for s in r["layouts"]["samples"]} for r in ranks
        ]
        # Mesh (dp, pp): ranks 2k and 2k + 1 are one pipeline; they hold the same requests and scores.
        for first, last in zip(per_rank[0::2], per_rank[1::2], strict=True):
            assert first == last
        assert set().union(*per_rank) == set(expected)
        for scored in per_rank:
            for key, s in scored.items():
                ref = expected[key]
                assert s["is_greedy"] == ref["is_greedy"], (s, ref)
                assert math.isclose(s["ll"], ref["ll"], rel_tol=1e-5, abs_tol=1e-5), (s, ref)
                # Every record carries its unconditional loglikelihood, wherever a data-parallel rank scored it.
                assert (s["ll_uncond"] is None) == (ref["ll_uncond"] is None), (s, ref)
                if ref["ll_uncond"] is not None:
                    assert math.isclose(s["ll_uncond"], ref["ll_uncond"], rel_tol=1e-5, abs_tol=1e-5), (s, ref)
    assert [r["layouts"]["last_rank"] for r in pipeline_launched[2]] == [1, 1]


def test_steps_have_the_schedules_fixed_shape(pipeline_launched) -> None:
    """Tokens forwarded count whole steps of batch_rows x seq_len, the same on both stages."""
    step = pipeline_checks.BATCH_ROWS * pipeline_checks.SEQ_LEN
    for ranks in pipeline_launched.values():
        tokens = [r["layouts"]["tokens_scored"] for r in ranks]
        assert tokens[0] > 0 and all(t % step == 0 for t in tokens)
        assert tokens[0::2] == tokens[1::2]


def test_a_scoring_error_on_the_last_stage_is_raised_on_every_stage(pipeline_launched) -> None:
    errors = [r["last_stage_failure"]["error"] for r in pipeline_launched[2]]
    assert errors[0] is not None and errors[0] == errors[1]
    assert "expected logits over at least" in errors[0] and "found 32" in errors[0]


def test_training_through_the_schedule_is_unchanged_by_evaluations(pipeline_single, pipeline_launched) -> None:
    for rank, result in enumerate(pipeline_launched[2]):
        runs = result["training"]
        assert runs["with_eval"]["params"] == runs["without"]["params"], f"rank {rank}"
        assert runs["with_eval"]["losses"] == runs["without"]["losses"], f"rank {rank}"
        assert runs["with_eval"]["training"] is True
        # The first evaluation, of the untrained model, through a 1F1B schedule built with a loss function.
        assert_same_metrics(runs["with_eval"]["metrics"], pipeline_single["train_tasks"], f"rank {rank}", 1e-5)
    assert all(loss > 0 for loss in pipeline_launched[2][1]["training"]["without"]["losses"])  # the last stage's


def test_pipeline_peers_must_share_a_data_parallel_rank(pipeline_launched) -> None:
    for result in pipeline_launched[2]:
        assert "no data-parallel group was given" in result["layouts"]["no_group"]
        assert "'pipeline' of 2 ranks" in result["layouts"]["no_group"]
        assert (
            "splits the peers of the model-parallel dimension ['pipeline']"
            in result["layouts"]["world_group"]
        )


def test_a_pipeline_adapter_needs_stages_and_a_step_shape() -> None:
    with pytest.raises(ConfigError, match="stages is empty"):
        PipelineAdapter(object(), [], batch_rows=4, seq_len=64)
    with pytest.raises(ConfigError, match="found batch_rows=0, seq_len=64"):
        PipelineAdapter(object(), [object()], batch_rows=0, seq_len=64)
