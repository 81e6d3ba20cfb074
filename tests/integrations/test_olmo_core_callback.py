"""The OLMo-core callback: a tiny OLMo-core model trained by the real OLMo-core `Trainer` for a few steps, in
one process and under torchrun with 2 gloo ranks; the adapter for OLMo-core models; the callback config.

The 2-rank launch (tests/support/workers/olmo_core_ranks.py) also runs the perplexity callback's 2-rank check
(its other tests: tests/integrations/test_olmo_core_perplexity.py), so that its processes start once."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from olmo_core.config import DType
from olmo_core.data import TokenizerConfig
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.train import TrainerConfig
from workers.launch import REPO, launch, read_ranks, worker_env
from workers.olmo_core_perplexity import N_DOCUMENTS, assert_ours_equal_theirs, olmo_core_figures
from workers.olmo_core_train import INTERVAL, LIMIT, SEQ_LEN, STEPS, TASKS, callback_config, train

from inloop_eval.data.root import TOKENIZER_DIR
from inloop_eval.engine.adapters.logits import LogitsAdapter
from inloop_eval.engine.families import make_adapter
from inloop_eval.engine.logprobs import chunk_positions
from inloop_eval.errors import ConfigError, TokenizerError, UnknownTaskError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.integrations import SECONDS_KEY, TOKENS_KEY
from inloop_eval.integrations.olmo_core.adapter import OLMoCoreAdapter
from inloop_eval.integrations.olmo_core.callback import InLoopEvalCallbackConfig, olmo_tokenizer, recorded
from inloop_eval.integrations.olmo_core.keys import EVAL_TIME_KEY

EVAL_STEPS = ["0", "2", "4"]  # eval_on_startup, every INTERVAL, eval_on_finish at the last step (once)
assert STEPS == 4 and INTERVAL == 2


def downstream(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith("eval/downstream/")}


@pytest.fixture(scope="module")
def single_runs(data_root, tmp_path_factory):
    """Single-process runs: with dropout with and without the callback, and without dropout with it; on
    flash-attention 2 (`flash_on_cpu`), with dropout with and without the callback."""
    out = {}
    for name, kwargs in {
        "dropout_cb": dict(with_callback=True, dropout=0.1),
        "dropout_plain": dict(with_callback=False, dropout=0.1),
        "cb": dict(with_callback=True),
        "flash_dropout_cb": dict(with_callback=True, dropout=0.1, flash=True),
        "flash_dropout_plain": dict(with_callback=False, dropout=0.1, flash=True),
    }.items():
        result, _ = train(tmp_path_factory.mktemp(name), data_root, **kwargs)
        out[name] = result
    return out


def test_trainer_records_the_figures_at_eval_steps_once(single_runs):
    """The figures reach OLMo-core's metric recording (what its callbacks' `log_metrics` receive) at the
    startup step, every `eval_interval` and at the end, never twice at one step; the wall time also goes
    into OLMo-core's throughput figure; max_length is the train module's sequence length."""
    logged = single_runs["dropout_cb"]["logged"]
    assert [s for s, m in logged.items() if downstream(m)] == EVAL_STEPS
    assert single_runs["dropout_cb"]["evaluations"] == {step: 1 for step in EVAL_STEPS}
    for step in EVAL_STEPS:
        metrics = logged[step]
        for task in TASKS:
            assert metrics[f"eval/downstream/{task}/n_docs"] == LIMIT
            assert 0.0 <= metrics[f"eval/downstream/{task}/acc"] <= 1.0
        assert metrics[TOKENS_KEY] > 0
        # The throughput figure holds this evaluation's time (merged by sum with OLMo-core's own evaluators).
        assert metrics[EVAL_TIME_KEY] == metrics[SECONDS_KEY] > 0
    assert single_runs["dropout_cb"]["max_lengths"] == {task: SEQ_LEN for task in TASKS}


@pytest.mark.parametrize("backend", ["torch", "flash"])
def test_training_is_bit_identical_with_and_without_the_callback(single_runs, backend):
    """Dropout on; on flash-attention 2 the evaluations ran through the engine's attention (its kernel
    raises in a forward without gradient), training through the kernel."""
    prefix = "flash_" if backend == "flash" else ""
    with_cb, plain = single_runs[f"{prefix}dropout_cb"], single_runs[f"{prefix}dropout_plain"]
    assert with_cb["params_sha"] == plain["params_sha"]
    for step in ("1", "2", "3", "4"):
        assert with_cb["logged"][step]["train/CE loss"] == plain["logged"][step]["train/CE loss"]
    assert not any(downstream(m) for m in plain["logged"].values())
    assert [s for s, m in with_cb["logged"].items() if downstream(m)] == EVAL_STEPS


@pytest.fixture(scope="module")
def two_ranks(data_root, tmp_path_factory) -> dict[str, list[dict]]:
    """torchrun, 2 ranks, DDP over gloo, one launch: run -> every rank's result, for the run with the in-loop
    callback (`callback`) and for OLMo-core's perplexity callback beside ours (`perplexity`)."""
    folder = tmp_path_factory.mktemp("two_ranks")
    args = [str(REPO / "tests" / "support" / "workers" / "olmo_core_ranks.py"), "--data-root", str(data_root)]
    args += ["--work", str(folder / "work"), "--out", str(folder / "out")]
    launch(2, args, timeout=360, env=worker_env(OLMO_SHARED_FS="1"))
    return {run: read_ranks(folder / "out" / run, 2) for run in ("callback", "perplexity")}


def test_two_gloo_ranks_match_one_process(single_runs, two_ranks):
    """torchrun, 2 ranks, DDP over gloo: every rank records the same figures, and they equal the
    single-process run's (exactly up to float32 summation at step 0, where the models are the same; within
    1e-4 later, where DDP's gradient all-reduce has moved the weights by float rounding)."""
    ranks = two_ranks["callback"]
    single = single_runs["cb"]["logged"]
    figures = [{s: downstream(ranks[r]["logged"][s]) for s in EVAL_STEPS} for r in range(2)]
    assert figures[0] == figures[1]
    assert ranks[0]["params_sha"] == ranks[1]["params_sha"]
    for step in EVAL_STEPS:
        expected = downstream(single[step])
        assert figures[0][step].keys() == expected.keys()
        tol = 1e-6 if step == "0" else 1e-4
        for key, value in expected.items():
            assert math.isclose(figures[0][step][key], value, rel_tol=tol, abs_tol=tol), (step, key)


def test_two_gloo_ranks_record_olmo_cores_perplexity_figures(two_ranks):
    """The perplexity callback (tests/integrations/test_olmo_core_perplexity.py) on 2 ranks: eval batches of 1
    sequence per rank (the train module's micro-batch), so global batches of 2 and 22 of the 23 documents, on
    both sides; every rank records OLMo-core's figures."""
    ranks = two_ranks["perplexity"]
    for result in ranks:
        assert_ours_equal_theirs(result)
        assert sum(result["scored"].values()) == N_DOCUMENTS // 2 * 2
    assert olmo_core_figures(ranks[0]["ours"]["2"]) == olmo_core_figures(ranks[1]["ours"]["2"])


def test_the_forward_runs_under_the_train_modules_autocast(data_root, tmp_path):
    """With `autocast_precision=bfloat16` the figures are those of the model evaluated under bfloat16
    autocast, not the float32 ones."""
    result, trainer = train(tmp_path, data_root, with_callback=True, autocast=DType.bfloat16, steps=0)
    recorded = downstream(result["logged"]["0"])
    model = trainer.train_module.model
    config = trainer.callbacks["inloop_eval"].evaluator.config
    evaluator = InLoopEvaluator(config, tokenizer=trainer.callbacks["inloop_eval"].evaluator.tokenizer)
    float32 = evaluator.run(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bfloat16 = evaluator.run(model)
    assert recorded == pytest.approx(bfloat16, rel=1e-9)
    # Without autocast the callback's figures would be these, bit for bit (the same deterministic path).
    assert recorded["eval/downstream/piqa/ce_gold"] != float32["eval/downstream/piqa/ce_gold"]


def test_config_survives_with_callback_and_the_saved_trainer_config(data_root, tmp_path):
    """`TrainerConfig.with_callback` deep-copies the callbacks added before; the saved config (JSON) holds
    every field and loads back into an equal config."""
    config = callback_config(data_root, key_style="olmo_core")
    trainer_config = TrainerConfig(save_folder=str(tmp_path)).with_callback("inloop_eval", config)
    trainer_config = trainer_config.with_callback("other", callback_config(data_root, tasks=["copa"]))
    assert trainer_config.callbacks["inloop_eval"] == config
    assert trainer_config.callbacks["inloop_eval"] is not config
    saved = json.loads(json.dumps(trainer_config.as_config_dict()))
    entry = saved["callbacks"]["inloop_eval"]
    assert entry["tasks"] == TASKS and entry["eval_interval"] == INTERVAL and entry["limit"] == LIMIT
    assert (
        entry["key_style"] == "olmo_core"
        and entry["tokenizer"]["identifier"] == "allenai/gpt-neox-olmo-dolma-v1_5"
    )
    assert TrainerConfig.from_dict(saved).callbacks["inloop_eval"] == config


def test_config_file_and_checks(data_root, tmp_path):
    path = tmp_path / "eval.yaml"
    path.write_text("evaluators: [{task: copa, limit: 3}]\neval_interval: 7\nmax_length: 64\n")
    config = InLoopEvalCallbackConfig(config=str(path), eval_interval=5).evaluator_config(128)
    assert (config.eval_interval, config.max_length, config.evaluators[0].task) == (5, 64, "copa")
    with pytest.raises(
        ConfigError, match="max_length 64 is longer than the train module's max_sequence_length 32"
    ):
        InLoopEvalCallbackConfig(config=str(path)).evaluator_config(32)
    tasks = InLoopEvalCallbackConfig(
        tasks=["piqa"], tokenizer=TokenizerConfig.gpt2(), limit=2, key_style="olmo_core"
    )
    built = tasks.evaluator_config(256)
    assert (built.max_length, built.key_style, built.evaluators[0].limit) == (256, "olmo_core", 2)
    with pytest.raises(ConfigError, match="name either `tasks`.*or `config`"):
        InLoopEvalCallbackConfig(tasks=["piqa"], config=str(path), tokenizer=TokenizerConfig.gpt2())
    with pytest.raises(ConfigError, match="name either `tasks`"):
        InLoopEvalCallbackConfig(tokenizer=TokenizerConfig.gpt2())
    with pytest.raises(ConfigError, match="`tokenizer` is required with `tasks`"):
        InLoopEvalCallbackConfig(tasks=["piqa"])
    with pytest.raises(ConfigError, match="`limit`, `batch_tokens` and `key_style` apply to `tasks`"):
        InLoopEvalCallbackConfig(config=str(path), limit=3)
    with pytest.raises(ConfigError, match="key_style must be one of"):
        InLoopEvalCallbackConfig(tasks=["piqa"], tokenizer=TokenizerConfig.gpt2(), key_style="olmo")
    assert (
        InLoopEvalCallbackConfig(tasks=["piqa"], tokenizer=TokenizerConfig.gpt2(), enabled=False).build(None)
        is None
    )


def test_strict_and_olmo_core_keys_only(data_root):
    gpt2 = TokenizerConfig.gpt2()
    assert InLoopEvalCallbackConfig(tasks=["piqa"], tokenizer=gpt2, strict=True).evaluator_config(64).strict
    assert not InLoopEvalCallbackConfig(tasks=["piqa"], tokenizer=gpt2).evaluator_config(64).strict
    with pytest.raises(ConfigError, match="olmo_core_keys_only=True needs key_style='olmo_core'"):
        InLoopEvalCallbackConfig(tasks=["olmo:piqa"], tokenizer=gpt2, olmo_core_keys_only=True)
    metrics = {
        "eval/downstream/piqa (accuracy)": 0.5,
        "eval/downstream/piqa (length-normalized accuracy v2)": 0.6,
        "eval/downstream/olmo:piqa/acc": 0.5,
        "eval/downstream/olmo:piqa/n_docs": 10.0,
        SECONDS_KEY: 1.0,
    }
    assert recorded(metrics, olmo_core_keys_only=False) == metrics
    assert list(recorded(metrics, olmo_core_keys_only=True)) == [
        "eval/downstream/piqa (accuracy)",
        "eval/downstream/piqa (length-normalized accuracy v2)",
    ]


def test_a_misspelled_task_stops_the_trainer_build(data_root):
    """Refused when OLMo-core builds the callbacks (every rank builds them), with the suggestion, not at the
    first evaluation."""
    config = callback_config(data_root, tasks=["olmo:hellaswg"])
    trainer = SimpleNamespace(train_module=SimpleNamespace(eval_batch_spec=None))
    with pytest.raises(UnknownTaskError, match="unknown task 'olmo:hellaswg'.*did you mean olmo:hellaswag"):
        config.build(trainer)


def test_tokenizer_from_olmo_tokenizer_config(data_root, tmp_path, monkeypatch):
    """A fetched identifier maps to its file, a local path works, BOS/EOS ids come from OLMo's config, and
    anything else names what to fetch."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_hub_cache"))  # whatever this machine has cached
    neox = TokenizerConfig.gpt_neox_olmo_dolma_v1_5()
    fetched = olmo_tokenizer(neox, data_root)
    assert (fetched.bos_token_id, fetched.eos_token_id) == (None, 50279)
    assert fetched.encode(" hello world") == [23120, 1533]
    with_bos = TokenizerConfig(
        vocab_size=50280,
        eos_token_id=0,
        pad_token_id=1,
        bos_token_id=50279,
        identifier=str(data_root / TOKENIZER_DIR / "gpt-neox-olmo-dolma-v1_5.json"),
    )
    local = olmo_tokenizer(with_bos, data_root)
    assert (local.bos_token_id, local.eos_token_id) == (50279, 0)
    assert local.fingerprint != fetched.fingerprint  # the request cache tells them apart
    with pytest.raises(TokenizerError, match=r"'gpt2'.*not one that `inloop-eval data fetch` fetches"):
        olmo_tokenizer(TokenizerConfig.gpt2(), data_root)
    with pytest.raises(TokenizerError, match=r"run `inloop-eval data fetch --root"):
        olmo_tokenizer(neox, tmp_path / "empty_root")
    bad = TokenizerConfig(vocab_size=10, eos_token_id=99999, pad_token_id=1, identifier=neox.identifier)
    with pytest.raises(TokenizerError, match="eos_token_id 99999 is outside the vocabulary"):
        olmo_tokenizer(bad, data_root)


def tiny_olmo_core_model() -> torch.nn.Module:
    config = TransformerConfig.llama_like(
        d_model=32, vocab_size=50304, n_layers=2, n_heads=2, hidden_size_multiple_of=16
    )
    model = config.build(init_device="cpu")
    torch.manual_seed(0)
    model.init_weights(device=torch.device("cpu"))
    return model.eval()


def test_olmo_core_models_ignore_a_mask_and_positions():
    """Why packed rows run under the attention route: the forward takes unknown keywords and ignores them."""
    model = tiny_olmo_core_model()
    ids = torch.randint(0, 50000, (2, 12))
    mask = torch.zeros(2, 1, 12, 12, dtype=torch.bool)
    with torch.no_grad():
        assert torch.equal(model(ids), model(ids, attention_mask=mask, position_ids=torch.zeros_like(ids)))


def test_the_head_scores_only_the_positions_read_a_chunk_at_a_time(data_root, neox_tokenizer):
    """The adapter's forward has the output head (OLMo-core's LMHead) score the targets itself: its `w_out`
    projects the positions read and nothing else, at most one chunk of positions at a time (no logits of the
    whole batch exist), and the loglikelihoods are those of full logits. Afterwards the head forwards as
    before. A bare model without max_length is refused."""
    model = tiny_olmo_core_model()
    tokens, projected = [], []
    hooks = [
        model.register_forward_pre_hook(lambda m, args: tokens.append(args[0].numel())),
        model.lm_head.w_out.register_forward_pre_hook(lambda m, args: projected.append(tuple(args[0].shape))),
    ]
    entries = [{"task": "piqa", "limit": 5, "batch_tokens": 512}, {"task": "mmlu_mc", "limit": 4}]
    config = EvaluatorConfig(evaluators=entries, data_root=str(data_root), strict=True, max_length=SEQ_LEN)
    adapter = make_adapter(model, SEQ_LEN)
    assert isinstance(adapter, OLMoCoreAdapter) and adapter.needs.packing and adapter.head_scores
    assert (adapter.max_length, adapter.vocab_size) == (SEQ_LEN, 50304)
    evaluator = InLoopEvaluator(config, tokenizer=neox_tokenizer)
    ours = evaluator.run(model)
    ll_ours = evaluator.detail("piqa").scores.ll.copy()
    for hook in hooks:
        hook.remove()
    assert projected and all(len(shape) == 2 and shape[0] <= chunk_positions(50304) for shape in projected)
    assert sum(shape[0] for shape in projected) < sum(tokens)
    assert "forward" not in model.lm_head.__dict__
    with torch.no_grad():
        assert model(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 50304)
    full = evaluator.run(LogitsAdapter(model, SEQ_LEN))
    assert evaluator.detail("piqa").scores.ll == pytest.approx(ll_ours, abs=1e-5)
    assert ours == pytest.approx(full, abs=1e-5)
    with pytest.raises(ConfigError, match="does not record the context length.*set `max_length:`"):
        make_adapter(model)


def test_a_head_of_another_class_projects_only_the_positions_read(data_root, neox_tokenizer):
    """An nGPT model (its NormalizedLMHead scales the logits, so the head is not scored in): the adapter
    calls the model with `logits_to_keep` (fewer positions than the batch is wide), one request per row (its
    blocks are not verified for packing), and gets the loglikelihoods of full logits."""
    config = TransformerConfig.ngpt_like(d_model=32, vocab_size=50304, n_layers=2, n_heads=2, hidden_size_multiple_of=16)
    model = config.build(init_device="cpu")
    torch.manual_seed(0)
    model.init_weights(device=torch.device("cpu"))
    model.eval()
    adapter = make_adapter(model, SEQ_LEN)
    assert isinstance(adapter, OLMoCoreAdapter) and not adapter.head_scores and not adapter.needs.packing
    kept: list[tuple[int, int]] = []
    hook = model.register_forward_pre_hook(
        lambda m, args, kwargs: kept.append((args[0].shape[1], kwargs["logits_to_keep"].shape[1])),
        with_kwargs=True,
    )
    entries = [{"task": "piqa", "limit": 4, "batch_tokens": 512}]
    config = EvaluatorConfig(evaluators=entries, data_root=str(data_root), strict=True, max_length=SEQ_LEN)
    evaluator = InLoopEvaluator(config, tokenizer=neox_tokenizer)
    evaluator.run(adapter)
    ll_ours = evaluator.detail("piqa").scores.ll.copy()
    assert kept and all(k < width for width, k in kept)
    hook.remove()
    evaluator.run(LogitsAdapter(model, SEQ_LEN))
    assert evaluator.detail("piqa").scores.ll == pytest.approx(ll_ours, abs=1e-5)


def test_callback_module_is_importable_without_side_effects():
    """The integration module is separate: `import inloop_eval` does not import olmo_core (checked in a
    fresh interpreter)."""
    code = "import sys, inloop_eval, inloop_eval.integrations; print('olmo_core' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=worker_env(), check=True
    )
    assert out.stdout.strip() == "False"
