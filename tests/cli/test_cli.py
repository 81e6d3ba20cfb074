"""`inloop-eval` as a user runs it: on a saved tiny Hugging Face model, checked against a plain forward."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys

import pytest
import torch
from workers.launch import LaunchFailed, launch

from inloop_eval.cli.evaluate import evaluate_config, write_json
from inloop_eval.cli.main import build_parser, main
from inloop_eval.errors import ConfigError
from inloop_eval.requests.tokenize import encode_pair

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
    from inloop_eval.data.tokenizer import load_tokenizer

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


# --- output paths checked before evaluating ------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--output", "--samples"])
@pytest.mark.parametrize("where", ["under_a_file", "a_directory"])
def test_evaluate_refuses_an_unwritable_output_before_evaluating(
    flag, where, hf_model_dir, data_root, tmp_path, capsys
):
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    bad = tmp_path / "notes.txt" / "results.json" if where == "under_a_file" else tmp_path
    args = ["evaluate", "--model", str(hf_model_dir), "--tasks", "piqa", "--limit", "2"]
    code = main([*args, "--data-root", str(data_root), flag, str(bad)])
    captured = capsys.readouterr()
    assert code == 2
    expected = "is a directory; name a file" if where == "a_directory" else "cannot write there"
    assert f"inloop-eval: error: evaluate: {flag} {bad}" in captured.err and expected in captured.err
    assert "eval/downstream" not in captured.out  # stopped before evaluating, not after


def test_every_rank_stops_when_rank_0_cannot_write_the_output(hf_model_dir, data_root, tmp_path):
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    bad = tmp_path / "notes.txt" / "results.json"
    args = ["-m", "inloop_eval.cli", "evaluate", "--model", str(hf_model_dir), "--tasks", "piqa"]
    args += ["--limit", "2", "--data-root", str(data_root), "--output", str(bad)]
    with pytest.raises(LaunchFailed) as failure:
        launch(2, args, timeout=300)
    rank0, rank1 = failure.value.ranks
    assert rank0.returncode and rank1.returncode, "a rank hung: the launcher killed it"
    assert f"inloop-eval: error: evaluate: --output {bad}: cannot write there" in rank0.stderr
    assert "inloop-eval: error: evaluate (rank 1): rank 0 cannot write the output files" in rank1.stderr
    assert not any("eval/downstream" in r.stdout + r.stderr for r in failure.value.ranks)


def test_evaluate_with_a_config_path_that_is_a_folder(hf_model_dir, tmp_path, capsys):
    code = main(["evaluate", "--model", str(hf_model_dir), "--config", str(tmp_path)])
    assert code == 2
    assert f"config file {tmp_path} is a directory; name a YAML file" in capsys.readouterr().err


def test_evaluate_tasks_fill_a_config_file_of_settings_only(tmp_path):
    """--tasks supplies the evaluators that a config file of settings leaves out, and the file's values
    are checked like any config's."""
    path = tmp_path / "settings.yaml"
    path.write_text("strict: true\neval_interval: 10\n")
    args = build_parser().parse_args(
        ["evaluate", "--model", "m", "--config", str(path), "--tasks", "piqa,copa"]
    )
    config = evaluate_config(args)
    assert [e.task for e in config.evaluators] == ["piqa", "copa"] and config.strict is True
    path.write_text('strict: "false"\n')
    with pytest.raises(ConfigError, match=f"{path}: strict must be true or false, found 'false'"):
        evaluate_config(args)
    args = build_parser().parse_args(["evaluate", "--model", "m", "--config", str(path)])
    path.write_text("strict: true\n")
    with pytest.raises(ConfigError, match=f"{path}: `evaluators` lists no evaluator"):
        evaluate_config(args)


def test_evaluate_exits_non_zero_naming_the_tasks_that_failed(hf_model_dir, tmp_path, capsys):
    """A batch job must not count a run whose figures are missing as a success: an empty data root fails
    every task, and `evaluate` says which and exits 1 (the failure figures are still printed)."""
    empty = tmp_path / "empty_root"
    empty.mkdir()
    code = main(["evaluate", "--model", str(hf_model_dir), "--tasks", "piqa,copa", "--data-root", str(empty)])
    out, err = capsys.readouterr()
    assert code == 1
    assert re.search(r"^downstream +piqa +failed +FAILED$", out, re.M), out
    assert re.search(r"^downstream +copa +failed +FAILED$", out, re.M), out
    assert "evaluate: 2 of the evaluations failed: downstream/piqa, downstream/copa" in err


def test_evaluate_output_writes_a_figure_that_is_not_finite_as_null(tmp_path):
    """`--output` is strict JSON (bare NaN is refused by most parsers): a NaN or inf figure is `null`."""
    path = tmp_path / "results.json"
    write_json(path, {"metrics": {"a": 0.5, "b": float("nan"), "c": float("inf")}, "model": "m"})

    def refuse(name: str) -> None:
        raise ValueError(f"bare {name} in the output")

    data = json.loads(path.read_text(), parse_constant=refuse)
    assert data["metrics"] == {"a": 0.5, "b": None, "c": None} and data["model"] == "m"
