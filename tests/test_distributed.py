"""The evaluator under real process groups (gloo on CPU, each rank in torchrun's environment): the same numbers
at world sizes 1-4, sharded models that make collectives in forward, failures on one rank, the request cache,
training; the `lm` evaluator at world sizes 1-3 (no sequence counted twice, no hang when a label is absent
from a rank's shard or a domain fails) and a domain that fails on one rank only (agreed by all); ranks that disagree (limits, task lists, counts and orders,
data-parallel groups, task data, pipeline arguments), refused on every rank before any forward, naming what
differs, well before the process group's 120 s timeout (a hang would sit it out).

One launch per world size runs the checks of tests/support/workers/dist_checks.py, at world size 2 with those
of tests/support/workers/agreement_checks.py and lm_rank_faults.py (tests/support/workers/world_checks.py runs
them all); world size 1
runs the checks of dist_checks in this process without a process group. Every launch has a free port and a
hard timeout.
"""
from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lm_helpers import write_domains
from workers import agreement_checks, dist_checks, world_checks
from workers.launch import REPO, launch, read_ranks, run_with_timeout, worker_env

from inloop_eval.engine.batching import row_lengths
from inloop_eval.engine.sharding import ICLMultiChoiceTaskDataset, subset_size
from inloop_eval.errors import ConfigError
from inloop_eval.evaluators.downstream import TaskEvalConfig
from inloop_eval.keys import SECONDS_KEY, TOKENS_KEY
from inloop_eval.requests.table import build_requests
from inloop_eval.tasks import get_task, load_docs

# World size -> the checks its launch runs.
LAUNCHES: dict[int, list[str]] = {
    2: [
        "cache",
        "metrics",
        "collective",
        "fsdp",
        "failures",
        "cache_race",
        "training",
        "olmo_core_fsdp",
        "olmo_core_tp",
        "lm",
        *(world_checks.AGREEMENT + name for name in agreement_checks.CHECKS),
        "lm_rank_faults",
    ],
    3: ["cache", "metrics", "collective", "fsdp", "failures", "lm"],
    4: ["cache", "metrics"],
}
LAUNCH_TIMEOUT_S = 300
EXACT = (
    "/acc",
    "/acc_norm",
    "/acc_bytes",
    "/acc_per_token",
    "/acc_pmi",
    "/n_docs",
    "/n_skipped_docs",
    "/failed",
)


def assert_same_metrics(found: dict[str, float], expected: dict[str, float], where: str) -> None:
    """Accuracies and counts exactly; every other figure within 1e-6."""
    assert sorted(found) == sorted(expected), where
    for key, value in expected.items():
        if key.endswith(EXACT):
            assert found[key] == value, f"{where}: {key} {found[key]} != {value}"
        else:
            assert math.isclose(found[key], value, rel_tol=1e-6, abs_tol=1e-6), f"{where}: {key}"


@pytest.fixture(scope="module")
def lm_domains(neox_tokenizer, tmp_path_factory) -> Path:
    """The `lm` check's domain files (`lm_helpers.write_domains`) and `broken.jsonl`, a JSONL file with a line
    that is not JSON."""
    folder = tmp_path_factory.mktemp("lm_domains")
    write_domains(folder, neox_tokenizer, n_tiny=1)
    (folder / "broken.jsonl").write_text('{"text": "fine"}\n{"text": not json}\n')
    return folder


@pytest.fixture(scope="module")
def single(data_root: Path, lm_domains: Path, tmp_path_factory) -> dict[str, Any]:
    """World size 1: the checks in this process, without a process group, on an empty request cache."""
    checks = sorted(
        {c for names in LAUNCHES.values() for c in names if c in dist_checks.CHECKS}
        - {"cache_race", "training", "olmo_core_tp"}
    )
    order = [c for c in dist_checks.CHECKS if c in checks]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INLOOP_EVAL_HOME", str(tmp_path_factory.mktemp("home1")))
        mp.setenv("LM_DOMAINS", str(lm_domains))
        return dist_checks.run_checks(order, data_root)


@pytest.fixture(scope="module")
def launched(
    data_root: Path, lm_domains: Path, rank_faults_work: Path, tmp_path_factory
) -> dict[int, list[dict[str, Any]]]:
    """World size -> every rank's results, one launch each (each on its own empty caches)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for nproc, checks in LAUNCHES.items():
        folder = tmp_path_factory.mktemp(f"ws{nproc}")
        args = [str(REPO / "tests" / "support" / "workers" / "world_checks.py"), "--data-root", str(data_root)]
        args += ["--out", str(folder), "--checks", ",".join(checks)]
        env = worker_env(
            INLOOP_EVAL_HOME=str(folder / "home"), LM_DOMAINS=str(lm_domains), LM_FAULTS_WORK=str(rank_faults_work)
        )
        launch(nproc, args, timeout=LAUNCH_TIMEOUT_S, env=env)
        out[nproc] = read_ranks(folder, nproc)
    return out


def ranks_with(launched: dict[int, list[dict[str, Any]]], check: str):
    for nproc, ranks in launched.items():
        if check in LAUNCHES[nproc]:
            for rank, results in enumerate(ranks):
                yield nproc, rank, results[check]


def test_world_sizes_give_identical_metrics(single, launched):
    expected = single["metrics"]["metrics"]
    assert expected["eval/downstream/copa/n_docs"] == 13
    for nproc, rank, result in ranks_with(launched, "metrics"):
        assert_same_metrics(result["metrics"], expected, f"world size {nproc} rank {rank}")


def test_shares_are_uneven_so_dummy_forwards_run(launched):
    """The check is only meaningful if ranks really forward different amounts (padding with dummies)."""
    for nproc in (2, 3):
        per_rank = launched[nproc][0]["metrics"]["tokens_forwarded"]
        assert any(len({r[label] for r in per_rank}) > 1 for label in per_rank[0]), nproc


def test_task_with_fewer_documents_than_ranks(single, launched):
    for nproc, rank, result in ranks_with(launched, "metrics"):
        metrics = result["metrics"]
        assert metrics["eval/downstream/copa_two/n_docs"] == 2, (nproc, rank)
        assert metrics["eval/downstream/copa_two/n_skipped_docs"] == 0, (nproc, rank)
    assert single["metrics"]["metrics"]["eval/downstream/copa_two/n_docs"] == 2


def test_subset_scores_whole_documents_at_every_world_size(single, launched, data_root, neox_tokenizer):
    spec = next(t for t in dist_checks.METRIC_TASKS if t.get("label") == "arc_easy_subset")
    task = get_task(spec["task"])
    table = build_requests(
        task, load_docs(task, str(data_root), limit=spec["limit"]), neox_tokenizer, dist_checks.MAX_LENGTH
    )
    n_docs = subset_size(table, spec["subset_num_batches"], spec["batch_tokens"])
    assert 1 < n_docs < spec["limit"]
    for nproc, _, result in [(1, 0, single["metrics"]), *ranks_with(launched, "metrics")]:
        metrics = result["metrics"]
        assert metrics["eval/downstream/arc_easy_subset/n_docs"] == n_docs, nproc
        assert metrics["eval/downstream/arc_easy_subset/n_skipped_docs"] == spec["limit"] - n_docs, nproc


def test_subset_size_takes_whole_leading_documents(data_root, neox_tokenizer):
    task = get_task("arc_easy")
    table = build_requests(task, load_docs(task, str(data_root), limit=20), neox_tokenizer, 512)
    cost_D = [int(row_lengths(table.pairs, table.rows_of_docs(np.array([d]))).sum()) for d in range(20)]
    cumulative = np.cumsum(cost_D)
    assert subset_size(table, 1, int(cumulative[4])) == 5  # exactly five documents' worth
    assert subset_size(table, 1, int(cumulative[4]) - 1) == 4  # the fifth does not fit whole
    assert subset_size(table, 2, int(cumulative[5]) // 2 + 1) == 6  # the budget is batches x tokens
    assert subset_size(table, 1, 1) == 1  # at least one document
    assert subset_size(table, 1000, 100_000) == 20
    dataset = ICLMultiChoiceTaskDataset(table, n_docs=5)
    assert len(dataset) == 5 and dataset.n_left_out == 15
    assert dataset.n_rows == len(table.rows_of_docs(np.arange(5)))


@pytest.mark.parametrize("value", [0, -2, 2.5, True, "3"])
def test_subset_num_batches_config_check(value):
    with pytest.raises(ConfigError, match="subset_num_batches must be an integer >= 1 or null"):
        TaskEvalConfig(task="piqa", subset_num_batches=value)


@pytest.mark.parametrize("check", ["collective", "fsdp"])
def test_sharded_models_give_single_process_numbers(single, launched, check):
    """A forward with a real all-gather, and FSDP2 `fully_shard`, at world sizes 2 and 3 (uneven shares):
    every rank makes as many forward calls, and the numbers are those of one process."""
    expected = single[check]["metrics"]
    for nproc, rank, result in ranks_with(launched, check):
        assert_same_metrics(result["metrics"], expected, f"{check} world size {nproc} rank {rank}")
        assert len(set(result["calls"])) == 1, (nproc, result["calls"])
        tokens = result["tokens_forwarded"]
        assert any(len({r[label] for r in tokens}) > 1 for label in tokens[0]), (nproc, tokens)


def test_fsdp_olmo_core_models_pack_and_give_single_process_numbers(single, launched):
    """An OLMo-core Transformer under its own FSDP2 (`apply_fsdp`) at world size 2, called through
    `__call__`: packed rows on every rank, as many forward calls on each, the numbers of the plain model
    scored one request per row in one process, and fewer tokens in all."""
    expected = single["olmo_core_fsdp"]
    for nproc, rank, result in ranks_with(launched, "olmo_core_fsdp"):
        assert_same_metrics(
            result["metrics"], expected["metrics"], f"olmo_core_fsdp world size {nproc} rank {rank}"
        )
        assert result["packs"] == [True] * nproc and len(set(result["calls"])) == 1
        for label, tokens in expected["tokens_forwarded"][0].items():
            assert sum(r[label] for r in result["tokens_forwarded"]) < tokens, label


def test_tensor_parallel_olmo_core_models_pack_and_give_single_process_numbers(single, launched):
    """An OLMo-core Transformer under its own tensor parallelism (heads sharded, sequence parallel norms):
    packed rows, the numbers of the plain model scored one request per row in one process, and fewer tokens
    than it; the single-device check still names the mesh dimension it does not allow."""
    expected = single["olmo_core_fsdp"]
    for nproc, rank, result in ranks_with(launched, "olmo_core_tp"):
        assert result["packs"] is True
        assert_same_metrics(result["metrics"], expected["metrics"], f"olmo_core_tp world size {nproc} rank {rank}")
        for label, tokens in expected["tokens_forwarded"][0].items():
            assert result["tokens_forwarded"][label] < tokens, label
        assert (
            result["refusal"] == "its parameters are split over the model-parallel mesh dimension(s) ['tp']"
        )


@pytest.mark.parametrize("scenario", ["prepare", "scoring_fsdp", "forward_plain"])
def test_failure_on_one_rank_is_agreed_and_the_job_goes_on(single, launched, scenario):
    """The task raises on the last rank only (while loading its data; while scoring a batch between the
    forwards of an FSDP2 model; inside the forward of a model without collectives): no rank hangs, every
    rank reports `failed = 1`, and the next task gives its usual numbers."""
    reference = single["failures"]["healthy_logits"]  # every scenario's model is called for full logits
    for nproc, rank, result in ranks_with(launched, "failures"):
        found = result[scenario][rank]
        assert found["eval/downstream/boom/failed"] == 1.0, (nproc, rank)
        assert not [k for k in found if k.startswith("eval/downstream/boom/") and not k.endswith("/failed")]
        healthy = {k: v for k, v in found.items() if k.startswith("eval/downstream/copa/")}
        assert_same_metrics(healthy, reference, f"{scenario} world size {nproc} rank {rank}")


def test_strict_failure_on_one_rank_raises_on_every_rank(launched):
    for nproc, rank, result in ranks_with(launched, "failures"):
        found = result["strict"][rank]
        if rank == nproc - 1:
            assert found.startswith("TaskDataError: task 'arc_challenge' doc 3: injected data error"), (nproc, found)
        else:  # the task named once, as every message names it
            expected = f"TaskFailedOnAnotherRank: task 'boom': evaluation failed on rank {nproc - 1} "
            assert found.startswith(expected), (nproc, rank, found)


def test_request_cache_is_written_by_rank_zero_and_read_by_the_others(single, launched):
    """First evaluator: rank 0 tokenizes, the others read its file; a second one (a restart) reads on every
    rank. `encode_calls` is [first, second] per rank."""
    assert single["cache"]["encode_calls"][0][0] > 0 and single["cache"]["encode_calls"][0][1] == 0
    for nproc, rank, result in ranks_with(launched, "cache"):
        first, second = result["encode_calls"][rank]
        assert (first > 0) == (rank == 0), (nproc, rank, first)
        assert second == 0, (nproc, rank)
        assert result["same_metrics"]
        assert len(result["files"]) == 2 and all(f.endswith(".npz") for f in result["files"])


def test_ranks_writing_the_same_cache_at_once_never_read_a_partial_file(launched):
    for rank, results in enumerate(launched[2]):
        race = results["cache_race"]
        assert race["bad"][rank] == [], rank
        assert race["reads"][rank] > 60, rank
        assert race["leftover_tmp"] == []


def test_ddp_and_fsdp_training_is_bit_for_bit_with_in_loop_eval(launched):
    """Seeded training with dropout, eval every k steps (from step 0) vs none: identical parameters."""
    for rank, results in enumerate(launched[2]):
        for kind in ("ddp", "fsdp"):
            with_eval, without = results["training"][kind]
            assert with_eval == without, (kind, rank)


LM_LABELS = ("code", "prose", "tiny")


def test_the_lm_evaluator_gives_the_same_figures_at_world_sizes_1_to_3(single, launched):
    """The same figures, the same number of forward calls on every rank, every sequence on exactly one rank,
    a label absent from some ranks' shards, and no hang when a domain fails (on every rank: a model too small
    for the tokens; on rank 0 only, while it builds the token cache: a JSONL line that is not JSON)."""
    results = {1: [single["lm"]]}
    results.update({n: [r["lm"] for r in ranks] for n, ranks in launched.items() if "lm" in LAUNCHES[n]})
    assert sorted(results) == [1, 2, 3]
    base = results[1][0]
    keys = {f"eval/lm/{label}/{k}" for label in LM_LABELS for k in ("ce", "ppl", "bpb")}
    assert set(base["metrics"]) == keys
    for world_size, ranks in results.items():
        assert len({r["calls"] for r in ranks}) == 1, f"world {world_size}: unequal forward calls"
        for label in LM_LABELS:  # every sequence on exactly one rank
            assert sum(r["shard"][label] for r in ranks) == base["shard"][label]
        for r in ranks:
            assert set(r["metrics"]) == keys
            for key, value in r["metrics"].items():
                assert math.isfinite(value)
                assert value == pytest.approx(base["metrics"][key], rel=1e-6), (world_size, key)
            assert r["too_small"] == {f"eval/lm/{label}/failed": 1.0 for label in LM_LABELS}
            assert r["rank0_fails"]["eval/lm/prose/failed"] == 1.0
            assert set(r["rank0_fails"]) == {"eval/lm/prose/failed"} | {
                f"eval/lm/{label}/{k}" for label in ("code", "tiny") for k in ("ce", "ppl", "bpb")
            }
            for label in ("code", "tiny"):
                assert r["rank0_fails"][f"eval/lm/{label}/ce"] == pytest.approx(
                    base["metrics"][f"eval/lm/{label}/ce"], rel=1e-6
                )
    assert any(r["shard"]["tiny"] == 0 for r in results[3])  # the label some ranks never saw


# ---- ranks that disagree -------------------------------------------------------------------------------

WELL_BEFORE_THE_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def agreement(launched) -> list[dict[str, Any]]:
    """Every rank's results of the agreement checks (world size 2), under their own names."""
    prefix = world_checks.AGREEMENT
    return [{k.removeprefix(prefix): v for k, v in ranks.items() if k.startswith(prefix)} for ranks in launched[2]]


def refused_alike(ranks: list[dict[str, Any]], *fragments: str) -> None:
    for rank, result in enumerate(ranks):
        assert "error" in result, (rank, result)
        for fragment in fragments:
            assert fragment in result["error"], (rank, fragment, result["error"])
        assert result["seconds"] < WELL_BEFORE_THE_TIMEOUT_S, (rank, result["seconds"])


def test_different_limits_are_refused_naming_the_setting_and_the_ranks(agreement) -> None:
    refused_alike([r["limits"] for r in agreement], "ConfigError", "evaluators[0].limit: rank 0 9, rank 1 13")


def test_different_task_lists_counts_and_orders_are_refused(agreement) -> None:
    refused_alike([r["task_lists"] for r in agreement], "evaluators[0].task: rank 0 \"copa\", rank 1 \"arc_easy\"")
    refused_alike([r["task_count"] for r in agreement], "evaluators.count: rank 0 1, rank 1 2")
    refused_alike([r["task_order"] for r in agreement], "evaluators[0].task", "evaluators[1].task")


def test_data_parallel_groups_that_disagree_are_refused(agreement) -> None:
    refused_alike([r["dp_groups"]["none_and_group"] for r in agreement], "data-parallel groups", "do not agree")
    refused_alike([r["dp_groups"]["not_a_member"] for r in agreement], "rank 1:", "dp_group")


def test_different_task_data_fails_the_task_on_every_rank(agreement) -> None:
    for result in agreement:
        assert result["task_data"]["lenient"]["metrics"]["eval/downstream/arc_easy/failed"] == 1.0
        after = result["task_data"]["after"]["metrics"]
        assert "eval/downstream/copa/acc" in after and "eval/downstream/copa/failed" not in after
    refused_alike([r["task_data"]["strict"] for r in agreement], "tokenized requests differ across ranks")


def test_pipeline_arguments_wrong_on_one_rank_are_refused_on_every_rank(agreement) -> None:
    refused_alike([r["pipeline_arguments"]["no_stages"] for r in agreement], "rank 1: stages is empty")
    refused_alike([r["pipeline_arguments"]["step_shape"] for r in agreement], "different step shapes", "seq_len=32")


# ---- a perplexity domain that fails on one rank only ------------------------------------------------------

LM_FIGURES = ("ce", "ppl", "bpb")


@pytest.fixture(scope="module")
def rank_faults_work(neox_tokenizer, tmp_path_factory) -> Path:
    """The `lm_rank_faults` check's folder: the domain files in `data/`, and each rank's home folder,
    `node-<rank>/`: `local.npy`, `local.jsonl` and `flaky.npy` on rank 0's only, rank 1's `flaky.npy` a file
    whose reading is a real I/O error."""
    work = tmp_path_factory.mktemp("lm_rank_faults")
    files = write_domains(work / "data", neox_tokenizer)
    for rank in range(2):
        (work / f"node-{rank}").mkdir()
    shutil.copy(files["tiny"], work / "node-0" / "local.npy")
    shutil.copy(files["prose"], work / "node-0" / "local.jsonl")
    shutil.copy(files["tiny"], work / "node-0" / "flaky.npy")
    (work / "node-1" / "flaky.npy").symlink_to("/proc/self/mem")  # reading it is a real EIO
    return work


def test_a_domain_missing_on_one_rank_is_agreed_by_all(launched):
    """Files under `~` that exist on rank 0's node only, and one that fails to read on rank 1's: every rank
    reports the same failed labels and the others' figures; strict, rank 1 names the file and rank 0 the rank;
    once rank 1's files are there the labels are tried again and give the figures of their twins."""
    ranks = [results["lm_rank_faults"] for results in launched[2]]

    healthy = {f"eval/lm/{label}/{k}" for label in LM_LABELS for k in LM_FIGURES}
    local_labels = ("local_tokens", "local_text", "flaky")
    local = {f"eval/lm/{label}/{k}" for label in local_labels for k in LM_FIGURES}
    for rank, r in enumerate(ranks):
        failed = {f"eval/lm/{label}/failed": 1.0 for label in local_labels}
        assert {k: v for k, v in r["first"].items() if k.endswith("/failed")} == failed
        assert set(r["first"]) == healthy | set(failed)
        assert r["first"] == ranks[0]["first"]
        assert set(r["second"]) == healthy | local  # retried once the files are there
        for key in healthy:
            assert math.isfinite(r["second"][key])
            assert r["first"][key] == pytest.approx(r["second"][key], rel=1e-9), (rank, key)
        for key in local:  # the same data as `tiny` and `prose`
            twin = key.replace("local_tokens", "tiny").replace("local_text", "prose").replace("flaky", "tiny")
            assert r["second"][key] == pytest.approx(r["second"][twin], rel=1e-6), (rank, key)
    assert ranks[1]["strict"].startswith("LMDataError: label 'local_tokens': file ")
    assert "local.npy does not exist" in ranks[1]["strict"]
    assert ranks[0]["strict"].startswith("TaskFailedOnAnotherRank: ")
    assert "rank 1" in ranks[0]["strict"]


# ---- the command line under torchrun ------------------------------------------------------------------

CLI_TASKS = ["--tasks", "copa,mmlu_mc", "--limit", "7", "--batch-tokens", "160", "--strict"]


def cli_args(hf_model_dir: Path, data_root: Path, out: Path) -> list[str]:
    return [
        "evaluate",
        "--model",
        str(hf_model_dir),
        "--data-root",
        str(data_root),
        *CLI_TASKS,
        "--output",
        str(out / "results.json"),
        "--samples",
        str(out / "samples.jsonl"),
    ]


@pytest.fixture(scope="module")
def cli_single(hf_model_dir, data_root, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli1")
    cmd = [sys.executable, "-m", "inloop_eval.cli", *cli_args(hf_model_dir, data_root, out)]
    run_with_timeout(cmd, timeout=LAUNCH_TIMEOUT_S, env=worker_env(INLOOP_EVAL_HOME=str(out / "home")))
    return out


CONSOLE_SCRIPT = Path(sys.executable).parent / "inloop-eval"


@pytest.mark.parametrize(
    ("nproc", "entry"),
    [(2, ["-m", "inloop_eval.cli"]), (3, [str(CONSOLE_SCRIPT)])],
    ids=["module-2", "console-script-3"],
)
def test_cli_under_torchrun_writes_the_single_process_numbers(
    cli_single, hf_model_dir, data_root, tmp_path, nproc, entry
):
    """`python -m inloop_eval.cli evaluate` and the `inloop-eval` script, each rank in torchrun's environment:
    rank 0 alone writes the results and samples, with the numbers of one process (and the run's own cost: its
    time and the tokens all ranks forwarded, padding and dummy batches included)."""
    console_script = entry[0] != "-m"
    if console_script and not CONSOLE_SCRIPT.exists():
        pytest.fail(f"the console script {CONSOLE_SCRIPT} is not installed (pip install -e .)")
    out = tmp_path / "out"
    launch(
        nproc,
        [*entry, *cli_args(hf_model_dir, data_root, out)],
        timeout=LAUNCH_TIMEOUT_S,
        env=worker_env(INLOOP_EVAL_HOME=str(tmp_path / "home")),
        python=not console_script,
    )
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "samples.jsonl"]
    found = json.loads((out / "results.json").read_text())
    expected = json.loads((cli_single / "results.json").read_text())
    assert found["world_size"] == nproc and expected["world_size"] == 1
    for metrics in (found["metrics"], expected["metrics"]):
        assert metrics.pop(SECONDS_KEY) > 0 and metrics.pop(TOKENS_KEY) > 0
    assert_same_metrics(found["metrics"], expected["metrics"], f"cli world size {nproc}")
    assert found["metrics"]["eval/downstream/copa/n_docs"] == 7

    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    reference = [json.loads(line) for line in (cli_single / "samples.jsonl").read_text().splitlines()]
    assert [(s["task"], s["doc_id"], s["cont_id"]) for s in samples] == [
        (s["task"], s["doc_id"], s["cont_id"]) for s in reference
    ]
    for s, r in zip(samples, reference, strict=True):
        assert s["context"] == r["context"] and s["continuation"] == r["continuation"]
        assert s["ll"] == pytest.approx(r["ll"], abs=1e-5)
        # Unconditional requests are dealt over the ranks apart from their documents: every record still
        # carries its document's unconditional loglikelihood.
        assert (s["ll_uncond"] is None) == (r["ll_uncond"] is None), (s, r)
        if r["ll_uncond"] is not None:
            assert s["ll_uncond"] == pytest.approx(r["ll_uncond"], abs=1e-5)
    assert all(r["ll_uncond"] is not None for r in reference)  # copa and mmlu_mc both report acc_pmi
