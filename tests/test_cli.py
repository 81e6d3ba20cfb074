"""`inloop-eval` as a user runs it: on a saved tiny Hugging Face model, checked against a plain forward."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest
import torch

from inloop_eval.cli import main
from inloop_eval.pairs import encode_pair

transformers = importlib.import_module("transformers")


def test_evaluate_matches_an_unbatched_forward(hf_model_dir, data_root, tmp_path):
    results, samples = tmp_path / "results.json", tmp_path / "samples.jsonl"
    cmd = [sys.executable, "-m", "inloop_eval.cli", "evaluate", "--model", str(hf_model_dir)]
    cmd += ["--tasks", "arc_easy,winogrande,mmlu_mc", "--limit", "12", "--batch-tokens", "300"]
    cmd += ["--data-root", str(data_root), "--output", str(results), "--samples", str(samples), "--strict"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads(results.read_text())["metrics"]
    assert metrics["eval/downstream/arc_easy/n_docs"] == 12
    assert "eval/downstream/mmlu_mc/acc" in metrics and "eval/downstream/mmlu_mc/acc_norm" not in metrics

    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    assert {line["task"] for line in lines} == {"arc_easy", "winogrande", "mmlu_mc"}
    assert sum(line["task"] == "winogrande" for line in lines) == 24
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_model_dir).eval()
    from inloop_eval.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(hf_model_dir)
    for line in lines:
        ctx, cont = encode_pair(tokenizer, line["context"], line["continuation"], 512)
        ids = torch.tensor([ctx + cont[:-1]])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
        positions = torch.arange(len(ctx) - 1, len(ctx) - 1 + len(cont))
        expected = float(logp[positions, torch.tensor(cont)].sum())
        assert line["ll"] == pytest.approx(expected, abs=1e-5), line
        assert line["n_tokens"] == len(cont)
        greedy = bool((logp[positions].argmax(-1) == torch.tensor(cont)).all())
        assert line["is_greedy"] == greedy
    mmlu_uncond = {line["ll_uncond"] for line in lines if line["task"] == "mmlu_mc"}
    assert len(mmlu_uncond) == 4  # " A".." D" after the same unconditional context, scored once each


def test_tasks_lists_formats_and_metrics(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert "hellaswag" in out and "mmlu_stem_mc" in out
    mc_line = next(line for line in out.splitlines() if line.startswith("mmlu_mc "))
    assert "no-op" in mc_line and "acc_norm" not in mc_line


def test_evaluate_unknown_task_is_a_clear_error(hf_model_dir, data_root, capsys):
    code = main(
        [
            "evaluate",
            "--model",
            str(hf_model_dir),
            "--tasks",
            "piqa,hellaswg",
            "--data-root",
            str(data_root),
            "--strict",
        ]
    )
    assert code == 2
    assert "unknown task 'hellaswg'" in capsys.readouterr().err


def test_evaluate_with_a_tokenizer_that_does_not_load(hf_model_dir, data_root, tmp_path, capsys):
    bad = tmp_path / "tok.json"
    bad.write_text("{not json")
    code = main(
        [
            "evaluate",
            "--model",
            str(hf_model_dir),
            "--tokenizer",
            str(bad),
            "--tasks",
            "piqa",
            "--data-root",
            str(data_root),
        ]
    )
    assert code == 2
    assert str(bad) in capsys.readouterr().err
