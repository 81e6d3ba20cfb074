"""The callback inside OLMo-core's own machinery, with the real `Trainer` on CPU (few steps, few documents):
seen as an `EvaluatorCallback` (`eval_checkpoints`, `no_evals`, `ModelMergeCallback`), resumed from a
checkpoint, replacing OLMo-core's downstream callback, and OLMo-core's task sets."""

from __future__ import annotations

import dataclasses
import math
import sys
import types

import pytest
import torch
from olmo_core.data import TokenizerConfig
from olmo_core.eval.task_groups import TASK_GROUPS
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.train import TrainerConfig
from olmo_core.train.callbacks import (
    DownstreamEvaluatorCallbackConfig,
    EvaluatorCallback,
    LMEvaluatorCallbackConfig,
    ModelMergeCallback,
)
from olmo_eval_data import olmo_eval_reads
from workers.olmo_core_train import callback_config, collected, train

from inloop_eval.data.root import TOKENIZER_DIR
from inloop_eval.errors import ConfigError
from inloop_eval.integrations.olmo_core.callback import (
    InLoopEvalCallback,
    InLoopEvalCallbackConfig,
    InLoopPerplexityCallbackConfig,
    replace_callback,
    task_set_ids,
    with_recommended_evals,
)


def downstream(metrics: dict[str, float], prefix: str = "eval") -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith(f"{prefix}/downstream/")}


def test_eval_checkpoints_runs_the_callback(data_root, tmp_path):
    """A trained run's checkpoint evaluated by `Trainer.eval_checkpoints()` gives the figures the run
    recorded at that step (the same weights), although that step was evaluated before it was saved."""
    trained, trainer = train(tmp_path / "run", data_root, with_callback=True, steps=2, save_interval=2)
    assert isinstance(trainer.callbacks["inloop_eval"], EvaluatorCallback)
    checkpoint = tmp_path / "run" / "save" / "step2"
    _, evaluating = train(
        tmp_path / "eval",
        data_root,
        with_callback=True,
        steps=2,
        fit=False,
        checkpoints_to_eval=[str(checkpoint)],
    )
    evaluating.eval_checkpoints()
    logged = collected(evaluating)["logged"]
    assert downstream(logged["2"]) and downstream(logged["2"]) == downstream(trained["logged"]["2"])


def test_no_evals_switches_the_callback_off(data_root, tmp_path):
    result, trainer = train(tmp_path, data_root, with_callback=True, steps=2, no_evals=True)
    assert "inloop_eval" in trainer.callbacks
    assert not any(downstream(m) for m in result["logged"].values())
    assert result["evaluations"] == {}


def test_resumed_run_records_each_step_once(data_root, tmp_path):
    """Stopped after evaluating step 2 (its checkpoint saved after that evaluation) and resumed with
    `eval_on_startup`: step 2 is not evaluated again; each of 0, 2, 4 is recorded once over both runs."""
    first, _ = train(tmp_path, data_root, with_callback=True, steps=2, save_interval=2)
    state = torch.load(tmp_path / "save" / "step2" / "train" / "rank0.pt", weights_only=False)
    assert state["callbacks"]["inloop_eval"] == {"last_evaluated_step": 2}
    resumed, trainer = train(tmp_path, data_root, with_callback=True, steps=4, save_interval=2)
    assert first["evaluations"] == {"0": 1, "2": 1}
    assert resumed["evaluations"] == {"4": 1}
    assert [s for s, m in resumed["logged"].items() if downstream(m)] == ["4"]
    assert trainer.callbacks["inloop_eval"].state_dict() == {"last_evaluated_step": 4}


def test_merged_weights_are_evaluated_under_olmo_cores_keys(data_root, tmp_path):
    """`ModelMergeCallback` at step 2 (average of steps 1 and 2) evaluates through this callback: the figures
    of the merged weights under `eval/merged/downstream/<label> (<words>)`, the keys and values OLMo-core's own
    `DownstreamEvaluatorCallback` records at the same merge; the training itself is untouched."""
    limit = 4
    tokenizer = dataclasses.replace(
        TokenizerConfig.gpt_neox_olmo_dolma_v1_5(),
        identifier=str(data_root / TOKENIZER_DIR / "gpt-neox-olmo-dolma-v1_5.json"),
    )

    def merge() -> dict[str, ModelMergeCallback]:
        return {"merge": ModelMergeCallback(merge_step=2, merge_last_n_steps=2, enabled=True)}

    ours_config = callback_config(
        data_root,
        tasks=["olmo:piqa"],
        tokenizer=tokenizer,
        limit=limit,
        key_style="olmo_core",
        eval_interval=100,
        eval_on_startup=False,
        eval_on_finish=False,
        olmo_core_keys_only=True,
    )
    ours, _ = train(
        tmp_path / "ours",
        data_root,
        with_callback=True,
        steps=2,
        callback=ours_config,
        extra_callbacks=merge(),
    )
    olmo_config = DownstreamEvaluatorCallbackConfig(tasks=["piqa"], tokenizer=tokenizer, eval_interval=100)
    with olmo_eval_reads(data_root, limit):
        theirs, _ = train(
            tmp_path / "theirs",
            data_root,
            with_callback=False,
            steps=2,
            extra_callbacks={**merge(), "downstream_evaluator": olmo_config},
        )
    merged_ours, merged_theirs = (
        downstream(ours["logged"]["2"], "eval/merged"),
        downstream(theirs["logged"]["2"], "eval/merged"),
    )
    assert "eval/merged/downstream/piqa (length-normalized accuracy)" in merged_theirs
    assert merged_ours.keys() == merged_theirs.keys()
    for key, value in merged_theirs.items():
        assert math.isclose(merged_ours[key], value, rel_tol=1e-5, abs_tol=1e-6), key
    assert not any(downstream(m) for m in ours["logged"].values())  # nothing else was due
    assert ours["params_sha"] == theirs["params_sha"]


def test_replace_callback_swaps_olmo_cores_downstream_evaluator(data_root):
    """`with_callback` refuses the taken name; `replace_callback` swaps it in one line on a copy."""
    neox = TokenizerConfig.gpt_neox_olmo_dolma_v1_5()
    olmo = TrainerConfig(save_folder="unused").with_callback(
        "downstream_evaluator", DownstreamEvaluatorCallbackConfig(tasks=["piqa"], tokenizer=neox)
    )
    ours = callback_config(data_root, tasks=["olmo:piqa"], key_style="olmo_core")
    with pytest.raises(OLMoConfigurationError, match="'downstream_evaluator' already exists"):
        olmo.with_callback("downstream_evaluator", ours)
    replaced = replace_callback(olmo, "downstream_evaluator", ours)
    assert replaced.callbacks["downstream_evaluator"] is ours
    assert isinstance(olmo.callbacks["downstream_evaluator"], DownstreamEvaluatorCallbackConfig)
    assert TrainerConfig.from_dict(replaced.as_config_dict()).callbacks["downstream_evaluator"] == ours
    with pytest.raises(
        ConfigError, match=r"no callback 'downstream_evaluatr' to replace.*downstream_evaluator"
    ):
        replace_callback(olmo, "downstream_evaluatr", ours)


@pytest.mark.parametrize("task_set", sorted(TASK_GROUPS))
def test_task_sets_hold_exactly_olmo_cores_labels(task_set):
    assert task_set_ids(task_set) == sorted(f"olmo:{label}" for label in TASK_GROUPS[task_set])


def test_with_recommended_evals_fast(data_root, monkeypatch):
    """task_set="fast": OLMo-core's 26 labels as `olmo:` tasks under OLMo-core's callback name and keys;
    with `cluster`, this project's perplexity callback beside it on OLMo-core's validation mix, under OLMo-core's
    name; every id accepted at the trainer build."""
    neox = TokenizerConfig.gpt_neox_olmo_dolma_v1_5()
    config = with_recommended_evals(
        TrainerConfig(save_folder="unused"),
        neox,
        task_set="fast",
        eval_interval=500,
        data_root=str(data_root),
    )
    downstream_config = config.callbacks["downstream_evaluator"]
    assert isinstance(downstream_config, InLoopEvalCallbackConfig) and list(config.callbacks) == [
        "downstream_evaluator"
    ]
    assert downstream_config.task_set == "fast"
    labels = [task.removeprefix("olmo:") for task in downstream_config.task_ids()]
    assert len(labels) == 26 and sorted(labels) == sorted(TASK_GROUPS["fast"])
    assert (
        downstream_config.key_style,
        downstream_config.eval_interval,
        downstream_config.eval_on_finish,
    ) == ("olmo_core", 500, True)
    trainer = types.SimpleNamespace(train_module=types.SimpleNamespace(eval_batch_spec=None))
    assert isinstance(downstream_config.build(trainer), InLoopEvalCallback)
    # OLMo-core finds the cluster's root through its beaker-dependent helpers: stand in for them.
    common = types.ModuleType("olmo_core.internal.common")
    common.get_root_dir = lambda cluster: "/mix"  # type: ignore[attr-defined]
    common.get_work_dir = lambda root: "/mix/cache"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "olmo_core.internal.common", common)
    both = with_recommended_evals(TrainerConfig(save_folder="unused"), neox, 128, "local", task_set="fast")
    perplexity = both.callbacks["lm_evaluator"]
    assert isinstance(perplexity, InLoopPerplexityCallbackConfig)
    assert isinstance(perplexity, LMEvaluatorCallbackConfig)  # every field of OLMo-core's config
    assert (perplexity.eval_dataset.mix_base_dir, perplexity.eval_dataset.work_dir) == ("/mix", "/mix/cache")
    assert (
        perplexity.eval_dataset.mix == "v3-small-ppl-validation"
        and perplexity.eval_dataset.sequence_length == 128
    )
    assert both.callbacks["downstream_evaluator"].task_ids() == downstream_config.task_ids()
    with pytest.raises(ConfigError, match="task_set 'fastest' is not one of OLMo-core's task sets"):
        with_recommended_evals(TrainerConfig(save_folder="unused"), neox, task_set="fastest")
    with pytest.raises(ConfigError, match="name either `tasks`.*`task_set`"):
        InLoopEvalCallbackConfig(tasks=["olmo:piqa"], task_set="fast", tokenizer=neox)
    saved = TrainerConfig.from_dict(config.as_config_dict())
    assert saved.callbacks["downstream_evaluator"] == downstream_config
