"""`python -m benchmarks.gpu`, its whole path on CPU: OLMo-core's evaluator and ours (one request per row, and
with shared prefixes through a compiled FlexAttention kernel, inductor on CPU as CUDA compiles it) each
evaluate the same spread documents twice in one process; every figure the report promises is there, each
way names the kernel that ran, the graphs are counted per evaluation (the later compiles none), the ways
predict alike, and the planner's cost constant is fitted on the compiled kernel with no call falling back.
No timing is asserted: the seconds are the benchmark's output."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_benchmark

LABEL = "arc_easy_rc_5shot"
LIMIT = 3
WAYS = ("olmo_core", "ours_per_row", "ours_shared")
STAND_IN = "SDPA stand-in for flash_2"
EVALUATION_FIELDS = {
    "wall_s", "graphs", "calls_captured", "compile_s", "peak_bytes", "flash_kernel_calls", "flex_attention"
}  # fmt: skip
ROW_FIELDS = {"label", "way", "documents", "tokens", "first", "later", "tokens_per_s", "bf16_peak_share", "kernel"}


@pytest.fixture(scope="module")
def run(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("bench") / "gpu.json"
    args = ["--device", "cpu", "--config", "olmo2_30M", "--dtype", "float32", "--labels", LABEL]
    args += ["--limit", str(LIMIT), "--attention-mask", "block", "--compile-attention", "true"]
    args += ["--fit-tokens", "1024", "--data-root", str(data_root)]
    return run_benchmark("gpu", *args, output=out, timeout=600)


def rows_by_way(report: dict, key: str = "rows") -> dict[str, dict]:
    return {row["way"]: row for row in report[key]}


def test_every_figure_is_reported_for_each_way_and_evaluation(run: tuple[dict, str]) -> None:
    report, printed = run
    for key in ("rows", "total"):
        rows = rows_by_way(report, key)
        assert set(rows) == set(WAYS)
        for way, row in rows.items():
            assert ROW_FIELDS <= set(row), (way, sorted(ROW_FIELDS - set(row)))
            assert row["documents"] == LIMIT and row["tokens"] > 0 and row["tokens_per_s"] > 0
            for evaluation in ("first", "later"):
                assert set(row[evaluation]) == EVALUATION_FIELDS
                assert row[evaluation]["wall_s"] > 0
                assert row[evaluation]["peak_bytes"] is None  # GPU memory, and only on CUDA
            assert row["bf16_peak_share"] is None  # only on CUDA, in bfloat16
    assert report["complete"] and report["device"] == "cpu" and report["parameters_counted"] > 0
    assert "all labels" in printed and printed.count("kernel: ") == 2 * len(WAYS)
    rows = rows_by_way(report)
    # Ours shares the shots: fewer tokens than one request per row, which pads nothing as OLMo-core's does.
    assert rows["ours_shared"]["tokens"] < rows["ours_per_row"]["tokens"] < rows["olmo_core"]["tokens"]


def test_each_way_names_the_kernel_that_ran(run: tuple[dict, str]) -> None:
    rows = rows_by_way(run[0])
    for way in ("olmo_core", "ours_per_row"):  # the model's own flash_2 backend
        later = rows[way]["later"]
        assert later["flash_kernel_calls"] > 0
        assert rows[way]["kernel"] == f"{run[0]['flash_kernel']}: {later['flash_kernel_calls']} calls"
        assert rows[way]["kernel"].startswith(STAND_IN)
    shared = rows["ours_shared"]
    for evaluation in ("first", "later"):  # every attention routed through the engine's: no flash call
        assert shared[evaluation]["flash_kernel_calls"] == 0
    assert shared["kernel"] == shared["later"]["flex_attention"]
    assert shared["kernel"].startswith("flex_attention compiled: ")
    assert "dense mask instead" not in shared["kernel"]
    assert rows_by_way(run[0], "total")["ours_shared"]["kernel"] == shared["kernel"]


def test_graphs_are_compiled_in_the_first_evaluation_only(run: tuple[dict, str]) -> None:
    rows = rows_by_way(run[0])
    for way in ("olmo_core", "ours_per_row"):
        for evaluation in ("first", "later"):
            assert rows[way][evaluation]["graphs"] == 0 and rows[way][evaluation]["calls_captured"] == 0
    first, later = rows["ours_shared"]["first"], rows["ours_shared"]["later"]
    assert first["graphs"] >= 1 and first["calls_captured"] >= first["graphs"] and first["compile_s"] > 0
    assert later["graphs"] == 0 and later["calls_captured"] == 0 and later["compile_s"] == 0


def test_the_ways_predict_alike(run: tuple[dict, str]) -> None:
    for key in ("rows", "total"):
        rows = rows_by_way(run[0], key)
        same = {"same": LIMIT, "documents": LIMIT, "one_side_only": 0}
        assert rows["ours_per_row"]["same_as_olmo_core"] == same
        assert rows["ours_shared"]["same_as_olmo_core"] == same
        assert rows["ours_shared"]["same_as_ours_per_row"] == same


def test_the_cost_constant_is_fitted_on_the_compiled_kernel(run: tuple[dict, str]) -> None:
    report, printed = run
    fit = report["attention_tokens_fit"]
    assert fit["fallback_calls"] == 0 and fit["attention_tokens"] is not None
    assert fit["tokens_per_forward"] == 1024 and set(fit["seconds_per_token"]) == {"256", "512", "1024"}
    # 3 row lengths x 4 forwards x the model's 4 attention layers, all in one graph of 1024 positions.
    assert fit["kernel"] == "flex_attention compiled: 48 calls over sequences of [1024]"
    assert "attention_tokens on this device: " in printed
