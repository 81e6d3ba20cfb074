"""Ranks that disagree are refused on every rank, before any forward, naming what differs, and no rank is
left waiting: different limits, task lists, task counts and orders, data-parallel groups (None on one rank,
a group on another; a group a rank is not in), task data (a task's requests differ), pipeline arguments wrong
on one rank. One launch of 2 processes runs tests/support/workers/agreement_checks.py; the process
group's timeout there is 120 s, and every check must end well before it (a hang would sit out the timeout).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from workers.launch import REPO, launch, read_ranks, worker_env

CHECKS = ["limits", "task_lists", "task_count", "task_order", "dp_groups", "task_data", "pipeline_arguments"]
WELL_BEFORE_THE_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def launched(data_root: Path, tmp_path_factory) -> list[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("agreement")
    args = [str(REPO / "tests" / "support" / "workers" / "agreement_checks.py"), "--data-root", str(data_root)]
    args += ["--out", str(folder), "--checks", ",".join(CHECKS)]
    launch(2, args, timeout=600, env=worker_env(INLOOP_EVAL_HOME=str(folder / "home")))
    return read_ranks(folder, 2)


def refused_alike(ranks: list[dict[str, Any]], *fragments: str) -> None:
    for rank, result in enumerate(ranks):
        assert "error" in result, (rank, result)
        for fragment in fragments:
            assert fragment in result["error"], (rank, fragment, result["error"])
        assert result["seconds"] < WELL_BEFORE_THE_TIMEOUT_S, (rank, result["seconds"])


def test_different_limits_are_refused_naming_the_setting_and_the_ranks(launched) -> None:
    refused_alike([r["limits"] for r in launched], "ConfigError", "evaluators[0].limit: rank 0 9, rank 1 13")


def test_different_task_lists_counts_and_orders_are_refused(launched) -> None:
    refused_alike([r["task_lists"] for r in launched], "evaluators[0].task: rank 0 \"copa\", rank 1 \"arc_easy\"")
    refused_alike([r["task_count"] for r in launched], "evaluators.count: rank 0 1, rank 1 2")
    refused_alike([r["task_order"] for r in launched], "evaluators[0].task", "evaluators[1].task")


def test_data_parallel_groups_that_disagree_are_refused(launched) -> None:
    refused_alike([r["dp_groups"]["none_and_group"] for r in launched], "data-parallel groups", "do not agree")
    refused_alike([r["dp_groups"]["not_a_member"] for r in launched], "rank 1:", "dp_group")


def test_different_task_data_fails_the_task_on_every_rank(launched) -> None:
    for result in launched:
        assert result["task_data"]["lenient"]["metrics"]["eval/downstream/arc_easy/failed"] == 1.0
        after = result["task_data"]["after"]["metrics"]
        assert "eval/downstream/copa/acc" in after and "eval/downstream/copa/failed" not in after
    refused_alike([r["task_data"]["strict"] for r in launched], "tokenized requests differ across ranks")


def test_pipeline_arguments_wrong_on_one_rank_are_refused_on_every_rank(launched) -> None:
    refused_alike([r["pipeline_arguments"]["no_stages"] for r in launched], "rank 1: stages is empty")
    refused_alike([r["pipeline_arguments"]["step_shape"] for r in launched], "different step shapes", "seq_len=32")
