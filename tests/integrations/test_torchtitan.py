"""The in-loop validator in torchtitan's real `Trainer` (torchtitan 0.3.0, CPU, gloo): a two-layer llama3
trained under tensor parallelism (vocabulary-sharded head, heads sharded, sequence parallel) and FSDP x TP,
evaluated at torchtitan's validation steps in packed rows with kept prefixes; its figures equal those of
the same trained weights gathered into an unsharded model and scored the plain way (full logits, one
request per row). How torchtitan is made to run on CPU: tests/support/torchtitan_cpu.py.

One launch per layout runs tests/support/workers/torchtitan_train.py.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from workers.launch import REPO, launch, read_ranks, worker_env

from inloop_eval.errors import ConfigError
from inloop_eval.keys import INTERVAL_KEY, SECONDS_KEY, TOKENS_KEY

# A ranked-classification task, a letter-key task, PMI (unconditional requests) and five shots (kept once, 167
# tokens: their row padded to sequence parallelism's multiple, 4); limits no world size divides evenly.
EVAL_CONFIG = {
    "evaluators": [
        {"task": "copa", "limit": 7, "batch_tokens": 96},
        {"task": "mmlu_mc", "limit": 5, "batch_tokens": 256},
        {"task": "arc_easy", "limit": 5, "batch_tokens": 160, "metrics": ["acc", "acc_norm", "acc_pmi"]},
        {"task": "olmo:piqa_rc_5shot", "limit": 5, "batch_tokens": 512},
    ],
    "outcomes": False,
}
# Layout -> (processes, worker arguments).
LAYOUTS: dict[str, tuple[int, list[str]]] = {
    "tp2": (2, ["--tp", "2"]),
    "fsdp2xtp2": (4, ["--tp", "2", "--dp-shard", "2"]),
}
STEPS = 2
EXACT = ("/acc", "/acc_norm", "/acc_bytes", "/acc_per_token", "/acc_pmi", "/n_docs", "/failed")
LAUNCH_TIMEOUT_S = 420


@pytest.fixture(scope="module", params=list(LAYOUTS))
def launched(request, data_root: Path, tmp_path_factory) -> tuple[str, list[dict[str, Any]]]:
    """(layout, every rank's result) of one launch of the torchtitan trainer."""
    layout = request.param
    nproc, layout_args = LAYOUTS[layout]
    folder = tmp_path_factory.mktemp(layout)
    config = folder / "eval.yaml"
    config.write_text(yaml.safe_dump(EVAL_CONFIG))
    args = [
        str(REPO / "tests" / "support" / "workers" / "torchtitan_train.py"),
        "--data-root",
        str(data_root),
    ]
    args += ["--work", str(folder), "--out", str(folder), "--config", str(config), *layout_args]
    launch(nproc, args, timeout=LAUNCH_TIMEOUT_S, env=worker_env(INLOOP_EVAL_HOME=str(folder / "home")))
    return layout, read_ranks(folder, nproc)


def test_the_validator_equals_the_unsharded_model(launched) -> None:
    """Every figure at the last step: accuracies and counts identical, the others within 1e-5."""
    layout, ranks = launched
    for rank, result in enumerate(ranks):
        found, expected = result["validator"]["metrics"], result["reference"]["metrics"]
        assert sorted(set(found) - {SECONDS_KEY, TOKENS_KEY, INTERVAL_KEY}) == sorted(expected), (layout, rank)
        assert any(key.endswith("/acc_pmi") for key in expected) and expected
        for key, value in expected.items():
            if key.endswith(EXACT):
                assert found[key] == value, f"{layout} rank {rank}: {key} {found[key]} != {value}"
            else:
                assert math.isclose(found[key], value, rel_tol=1e-5, abs_tol=1e-5), (layout, rank, key)


def test_per_request_scores_and_greedy_flags_equal_the_unsharded_model(launched) -> None:
    layout, ranks = launched
    expected = {
        (s["task"], s["doc_id"], s["cont_id"]): s for result in ranks for s in result["reference"]["samples"]
    }
    scored = set()
    for rank, result in enumerate(ranks):
        for s in result["validator"]["samples"]:
            ref = expected[(s["task"], s["doc_id"], s["cont_id"])]
            assert s["is_greedy"] == ref["is_greedy"], (layout, rank, s)
            assert math.isclose(s["ll"], ref["ll"], rel_tol=1e-5, abs_tol=1e-5), (layout, rank, s, ref)
            scored.add((s["task"], s["doc_id"], s["cont_id"]))
    assert scored == set(expected), layout


def test_the_validator_packs_rows_and_keeps_the_shots(launched) -> None:
    """The tensor-parallel model takes packed rows (fewer tokens than one request per row) and keeps the five
    shots' keys and values (this rank's heads) for the rows after them, their row padded to a multiple of 4
    (sequence parallelism's divisor); the figures above are theirs, and every module's forward is
    torchtitan's own again after each validation."""
    layout, ranks = launched
    for rank, result in enumerate(ranks):
        assert result["validator"]["tokens"] < result["reference"]["tokens"], (layout, rank)
        kept = result["validator"]["kept_prefixes"]
        assert kept and any(length % 4 for length in kept), (layout, rank, kept)
        assert result["forwards_changed"] == [], (layout, rank)  # torchtitan's own wrappers put back


def test_tensor_parallel_peers_score_the_same_documents_and_data_parallel_ranks_share_them_out(
    launched,
) -> None:
    layout, ranks = launched
    rows = [sorted((s["task"], s["doc_id"], s["cont_id"]) for s in r["validator"]["samples"]) for r in ranks]
    assert rows[0] == rows[1], layout  # ranks 0 and 1 are tensor-parallel peers in both layouts
    if layout == "fsdp2xtp2":
        assert rows[2] == rows[3] and rows[0] != rows[2]
        assert [r["mesh"] for r in ranks] == [{"tp": 2, "batch": 2}] * 4


def test_the_trainer_trains_and_logs_the_figures_at_its_validation_steps(launched) -> None:
    """torchtitan validates at step 1 and every `freq` (2) steps; its metric logger gets the training loss
    and our figures at both."""
    layout, ranks = launched
    for result in ranks:
        assert result["trained_steps"] == STEPS
        for step in ("1", "2"):
            keys = result["logged"][step]
            assert "loss_metrics/global_avg_loss" in keys, (layout, step)
            # The training since the previous validation is logged from the second validation on.
            assert set(result["validator"]["metrics"]) - {INTERVAL_KEY} <= set(keys), (layout, step)
            assert (INTERVAL_KEY in keys) == (step == "2"), (layout, step)


def test_config_names_tasks_or_a_file() -> None:
    from inloop_eval.integrations.torchtitan.validator import InLoopValidator

    with pytest.raises(ConfigError, match="either `tasks`"):
        InLoopValidator.Config()
    with pytest.raises(ConfigError, match="either `tasks`"):
        InLoopValidator.Config(tasks=["piqa"], config="eval.yaml")
    with pytest.raises(ConfigError, match="lists no task"):
        InLoopValidator.Config(tasks=[])
    with pytest.raises(ConfigError, match="set them in that file"):
        InLoopValidator.Config(config="eval.yaml", limit=3)
    config = InLoopValidator.Config(tasks=["piqa", "copa"], limit=5, freq=50).evaluator_config(seq_len=256)
    assert [e.task for e in config.evaluators] == ["piqa", "copa"]
    assert config.max_length == 256 and config.eval_interval == 50


def test_a_config_file_may_only_lower_the_context(tmp_path) -> None:
    from inloop_eval.integrations.torchtitan.validator import InLoopValidator

    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump({**EVAL_CONFIG, "max_length": 512}))
    with pytest.raises(ConfigError, match="longer than the training seq_len 256"):
        InLoopValidator.Config(config=str(path)).evaluator_config(seq_len=256)
    assert InLoopValidator.Config(config=str(path)).evaluator_config(seq_len=1024).max_length == 512


@pytest.mark.parametrize("degrees", [{"cp": 2}, {"pp": 2}])
def test_context_and_pipeline_parallel_layouts_are_refused(degrees: dict[str, int]) -> None:
    from torchtitan.distributed import ParallelDims

    from inloop_eval.integrations.torchtitan.validator import check_parallel_dims

    sizes = {"dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1, "pp": 1, "ep": 1, **degrees}
    dims = ParallelDims(**sizes, world_size=2)
    name = "context" if "cp" in degrees else "pipeline"
    with pytest.raises(ConfigError, match=f"{name} parallelism .* is not supported yet"):
        check_parallel_dims(dims)


def test_batch_widths_stay_multiples_of_the_sequence_divisor_under_a_config_multiple(
    data_root, neox_tokenizer
) -> None:
    """torchtitan's sequence divisor (here 4, as TP=4 sequence parallelism needs) and the config's
    `pad_to_multiple: 6` together: every forward is a multiple of lcm(4, 6) = 12 wide, never of 6 only, and
    the numbers are those of the model unpadded."""
    import torch

    from inloop_eval.evaluators.config import EvaluatorConfig
    from inloop_eval.evaluators.orchestrator import InLoopEvaluator
    from inloop_eval.integrations.torchtitan.adapter import TorchTitanAdapter
    from inloop_eval.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=240)).eval()
    widths: list[int] = []

    def forward(ids_BT: torch.Tensor) -> torch.Tensor:
        widths.append(ids_BT.shape[1])
        return model(ids_BT)

    def figures(pad_to_multiple: int, adapter: Any) -> dict[str, float]:
        entries = [{"task": "copa", "limit": 9, "batch_tokens": 96}, {"task": "arc_easy", "limit": 5}]
        config = EvaluatorConfig(
            evaluators=entries, data_root=str(data_root), max_length=240, strict=True, pad_to_multiple=pad_to_multiple
        )
        return InLoopEvaluator(config, tokenizer=neox_tokenizer).run(adapter)

    found = figures(6, TorchTitanAdapter(model, forward=forward, max_length=240, seq_multiple=4))
    assert widths and all(w % 12 == 0 for w in widths), sorted(set(widths))
    expected = figures(1, model)
    assert found.keys() == expected.keys()
    for key, value in expected.items():
        assert math.isclose(found[key], value, rel_tol=1e-5, abs_tol=1e-6), key
