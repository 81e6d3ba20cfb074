"""`inloop-eval compare` on two saved models' `evaluate --outcomes` results, against a recomputation from
their `--samples` files; an evaluation against itself; a step evaluated on other documents."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from helpers import tiny_neox

from inloop_eval.cli.main import main
from inloop_eval.data.root import neox_tokenizer_path

TASKS = "arc_easy,winogrande"


def evaluate(model: Path, data_root: Path, out: Path, *, limit: int, step: int = 0) -> Path:
    """`inloop-eval evaluate --outcomes out --samples out/samples_<step>.jsonl`; returns the samples file."""
    samples = out / f"samples_{step}.jsonl"
    cmd = [sys.executable, "-m", "inloop_eval.cli", "evaluate", "--model", str(model), "--tasks", TASKS]
    cmd += ["--limit", str(limit), "--data-root", str(data_root), "--strict", "--batch-tokens", "600"]
    cmd += ["--outcomes", str(out), "--step", str(step), "--samples", str(samples)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return samples


@pytest.fixture(scope="module")
def two_models(tmp_path_factory, data_root, hf_model_dir):
    """Two random models (seeds 0 and 1) evaluated on 30 documents of each task; the first also at step 100
    on the first 20 only."""
    second = tmp_path_factory.mktemp("hf1") / "tiny-neox-seed1"
    tiny_neox(seed=1).save_pretrained(second)
    shutil.copy(neox_tokenizer_path(data_root), second / "tokenizer.json")
    out = tmp_path_factory.mktemp("evaluations")
    samples_a = evaluate(hf_model_dir, data_root, out / "a", limit=30)
    samples_b = evaluate(second, data_root, out / "b", limit=30)
    evaluate(hf_model_dir, data_root, out / "a", limit=20, step=100)
    return out / "a", out / "b", samples_a, samples_b


def compare_json(capsys, *args: str) -> dict:
    assert main(["compare", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def per_document_from_samples(path: Path) -> dict[str, dict[str, dict[int, float]]]:
    """task -> figure -> doc -> value, recomputed from the request records: acc (argmax of ll, ties to the
    lowest choice, is gold) and ce_gold (the gold continuation's -ll per token)."""
    docs: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for line in path.read_text().splitlines():
        record = json.loads(line)
        docs[record["task"], record["doc_id"]].append(record)
    out: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for (task, doc), records in docs.items():
        records.sort(key=lambda r: r["cont_id"])
        best = max(range(len(records)), key=lambda i: (records[i]["ll"], -i))
        gold = next(r for r in records if r["gold"])
        out[task]["acc"][doc] = float(records[best]["gold"])
        out[task]["ce_gold"][doc] = -gold["ll"] / gold["n_tokens"]
    return out


def exact_mcnemar(b_only: int, a_only: int) -> float:
    n = b_only + a_only
    return 1.0 if n == 0 else min(1.0, sum(math.comb(n, i) for i in range(min(b_only, a_only) + 1)) * 2 / 2**n)


def test_compare_equals_a_recomputation_from_the_samples_files(two_models, capsys):
    a_dir, b_dir, samples_a, samples_b = two_models
    found = compare_json(capsys, f"{a_dir}@0", b_dir)
    assert found["b"]["step"] == 0 and found["a"]["step"] == 0
    a, b = per_document_from_samples(samples_a), per_document_from_samples(samples_b)
    for task in TASKS.split(","):
        entry = found["tasks"][task]
        assert (entry["n_both"], entry["n_only_a"], entry["n_only_b"], entry["note"]) == (30, 0, 0, "")
        for figure in ("acc", "ce_gold"):
            docs = sorted(a[task][figure])
            a_N = np.array([a[task][figure][d] for d in docs])
            b_N = np.array([b[task][figure][d] for d in docs])
            d_N = b_N - a_N
            se = d_N.std(ddof=1) / math.sqrt(len(d_N))
            got = entry["figures"][figure]
            assert got["n"] == 30
            for key, want in (("a", a_N.mean()), ("b", b_N.mean()), ("diff", d_N.mean()), ("stderr", se)):
                assert got[key] == pytest.approx(want, abs=1e-9), (task, figure, key)
            assert got["ci95"] == pytest.approx([d_N.mean() - 1.96 * se, d_N.mean() + 1.96 * se], abs=1e-9)
            if figure == "acc":
                want_p = exact_mcnemar(int((d_N > 0).sum()), int((d_N < 0).sum()))
                assert got["test"] == "exact McNemar" and got["p_value"] == pytest.approx(want_p, abs=1e-9)
            else:
                assert got["test"] == "paired t"


def test_an_evaluation_compared_with_itself_differs_by_nothing(two_models, capsys):
    a_dir = two_models[0]
    found = compare_json(capsys, f"{a_dir}@0", f"{a_dir}@0")
    for task in found["tasks"].values():
        for figure in task["figures"].values():
            assert (figure["diff"], figure["ci95"], figure["p_value"]) == (0.0, [0.0, 0.0], 1.0)
            assert figure["verdict"] == "cannot tell"


def test_a_step_evaluated_on_other_documents_is_compared_on_both_and_says_so(two_models, capsys):
    a_dir = two_models[0]
    found = compare_json(capsys, f"{a_dir}@0", a_dir)  # the latest step of a: 100, on 20 documents
    assert found["b"]["step"] == 100
    task = found["tasks"]["arc_easy"]
    assert (task["n_both"], task["n_only_a"], task["n_only_b"]) == (20, 10, 0)
    assert "compared on the 20 documents both evaluated (A alone: 10, B alone: 0)" in task["note"]
    assert task["figures"]["acc"]["n"] == 20
    assert main(["compare", f"{a_dir}@0", f"{a_dir}@100"]) == 0
    table = capsys.readouterr().out
    assert "note: arc_easy: compared on the 20 documents" in table and "\033[" not in table  # not a tty


def test_a_missing_step_is_an_error_naming_the_steps_held(two_models, capsys):
    assert main(["compare", f"{two_models[0]}@5", str(two_models[1])]) == 2
    assert "no outcomes of step 5" in capsys.readouterr().err
