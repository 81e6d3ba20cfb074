"""The evaluator on a model split into pipeline stages (`PipelineAdapter` over torch's schedules), under real
process groups (torchrun, gloo on CPU): PP=2 (2 processes) and DP=2 x PP=2 (4) give the figures of the
unsplit model in one process, downstream (rc, letter-key, PMI) and perplexity; a last stage's scoring error
reaches every rank; training through the same schedule (1F1B, with a loss) is unchanged by evaluations,
whose first figures equal the unsplit model's; an interleaved schedule (two stages per rank) gives the same
figures; a missing or wrong data-parallel group is refused.

One launch per world size runs the checks of tests/support/workers/pipeline_checks.py; world size 1
runs the unsplit model in this process (the reference).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from helpers import assert_same_metrics
from workers import pipeline_checks
from workers.launch import REPO, launch, read_ranks, worker_env

from inloop_eval.engine.adapters.pipeline import PipelineAdapter
from inloop_eval.errors import ConfigError

LAUNCHES: dict[int, list[str]] = {2: ["layouts", "last_stage_failure", "training"], 4: ["layouts"]}
LAUNCH_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def single(data_root: Path, tmp_path_factory) -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INLOOP_EVAL_HOME", str(tmp_path_factory.mktemp("home1")))
        return pipeline_checks.run_checks(["layouts"], data_root)["layouts"]


@pytest.fixture(scope="module")
def launched(data_root: Path, tmp_path_factory) -> dict[int, list[dict[str, Any]]]:
    """World size -> every rank's results, one launch each."""
    out: dict[int, list[dict[str, Any]]] = {}
    for nproc, checks in LAUNCHES.items():
        folder = tmp_path_factory.mktemp(f"ws{nproc}")
        args = [
            str(REPO / "tests" / "support" / "workers" / "pipeline_checks.py"),
            "--data-root",
            str(data_root),
        ]
        args += ["--out", str(folder), "--checks", ",".join(checks)]
        launch(nproc, args, timeout=LAUNCH_TIMEOUT_S, env=worker_env(INLOOP_EVAL_HOME=str(folder / "home")))
        out[nproc] = read_ranks(folder, nproc)
    return out


def test_pipeline_layouts_give_the_figures_of_one_process(single, launched) -> None:
    reference = single["reference"]["metrics"]
    assert (
        any(k.startswith("eval/lm/") for k in reference) and "eval/downstream/arc_easy/acc_pmi" in reference
    )
    for nproc, ranks in launched.items():
        for rank, result in enumerate(ranks):
            assert_same_metrics(
                result["layouts"]["metrics"], reference, f"{nproc} processes rank {rank}", 1e-5
            )


def test_an_interleaved_schedule_with_two_stages_per_rank_gives_the_same_figures(single, launched) -> None:
    """ScheduleInterleaved1F1B over 4 stages (embeddings | block | block | head), two on each rank."""
    expected = {(s["task"], s["doc_id"], s["cont_id"]): s["ll"] for s in single["reference"]["samples"]}
    for rank, result in enumerate(launched[2]):
        found = result["layouts"]["interleaved"]
        assert_same_metrics(
            found["metrics"], single["reference"]["metrics"], f"interleaved rank {rank}", 1e-5
        )
        assert len(found["samples"]) == len(expected)
        for s in found["samples"]:
            ll = expected[(s["task"], s["doc_id"], s["cont_id"])]
            assert math.isclose(s["ll"], ll, rel_tol=1e-5, abs_tol=1e-5), (s, ll)


def test_every_stage_gets_the_last_stages_scores_of_each_request(single, launched) -> None:
    expected = {(s["task"], s["doc_id"], s["cont_id"]): s for s in single["reference"]["samples"]}
    for ranks in launched.values():
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
    assert [r["layouts"]["last_rank"] for r in launched[2]] == [1, 1]


def test_steps_have_the_schedules_fixed_shape(launched) -> None:
    """Tokens forwarded count whole steps of batch_rows x seq_len, the same on both stages."""
    step = pipeline_checks.BATCH_ROWS * pipeline_checks.SEQ_LEN
    for ranks in launched.values():
        tokens = [r["layouts"]["tokens_scored"] for r in ranks]
        assert tokens[0] > 0 and all(t % step == 0 for t in tokens)
        assert tokens[0::2] == tokens[1::2]


def test_a_scoring_error_on_the_last_stage_is_raised_on_every_stage(launched) -> None:
    errors = [r["last_stage_failure"]["error"] for r in launched[2]]
    assert errors[0] is not None and errors[0] == errors[1]
    assert "expected logits over at least" in errors[0] and "found 32" in errors[0]


def test_training_through_the_schedule_is_unchanged_by_evaluations(single, launched) -> None:
    for rank, result in enumerate(launched[2]):
        runs = result["training"]
        assert runs["with_eval"]["params"] == runs["without"]["params"], f"rank {rank}"
        assert runs["with_eval"]["losses"] == runs["without"]["losses"], f"rank {rank}"
        assert runs["with_eval"]["training"] is True
        # The first evaluation, of the untrained model, through a 1F1B schedule built with a loss function.
        assert_same_metrics(runs["with_eval"]["metrics"], single["train_tasks"], f"rank {rank}", 1e-5)
    assert all(loss > 0 for loss in launched[2][1]["training"]["without"]["losses"])  # the last stage's


def test_pipeline_peers_must_share_a_data_parallel_rank(launched) -> None:
    for result in launched[2]:
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
