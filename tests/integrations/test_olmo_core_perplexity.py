"""The replacement of OLMo-core's perplexity callback (`InLoopPerplexityCallbackConfig`) in a real OLMo-core
`Trainer` on CPU, beside OLMo-core's own `LMEvaluatorCallbackConfig` on the same numpy files: the same keys
`eval/lm/<label>/CE loss` and `PPL` with the same values, on one process (on 2 gloo ranks: in
tests/integrations/test_olmo_core_callback.py, whose launch runs it); the config's round trip, OLMo-core's
validation mix in `with_recommended_evals`, and the configs it refuses."""

from __future__ import annotations

import numpy as np
import pytest
from olmo_core.data import DataCollator, NumpyDataLoaderBase, NumpyPaddedFSLDatasetConfig, TokenizerConfig
from olmo_core.train import TrainerConfig
from olmo_core.train.common import Duration
from olmo_core.train.train_module import EvalBatchSizeUnit, EvalBatchSpec
from workers.olmo_core_perplexity import (
    DOCUMENTS,
    N_DOCUMENTS,
    assert_ours_equal_theirs,
    both_runs,
    olmo_core_config,
    write_documents,
)
from workers.olmo_core_train import SEQ_LEN, callback_config, train

from inloop_eval.data.perplexity.documents import LoaderSelection, loader_selection
from inloop_eval.errors import ConfigError
from inloop_eval.integrations.olmo_core.callback import (
    InLoopPerplexityCallbackConfig,
    recorded,
    replace_callback,
    with_recommended_evals,
)
from inloop_eval.integrations.olmo_core.perplexity import loader_batches

BATCH_SPEC = EvalBatchSpec(rank_batch_size=2 * SEQ_LEN, max_sequence_length=SEQ_LEN)


@pytest.fixture(scope="module")
def single_run(data_root, tmp_path_factory) -> dict:
    return both_runs(tmp_path_factory.mktemp("perplexity"), data_root)


def test_one_process_records_olmo_cores_figures(single_run):
    """23 documents, eval batches of 2 sequences: OLMo-core's loader reaches 22; so do we."""
    assert_ours_equal_theirs(single_run)
    assert sum(single_run["scored"].values()) == N_DOCUMENTS // 2 * 2
    for label in DOCUMENTS:  # our own figures beside OLMo-core's
        assert {f"eval/lm/{label}/ce", f"eval/lm/{label}/bpb"} <= single_run["ours"]["2"].keys()


def test_config_round_trip_and_replacing_olmo_cores_callback(tmp_path):
    neox = TokenizerConfig.gpt_neox_olmo_dolma_v1_5()
    theirs = olmo_core_config(tmp_path, neox, eval_duration=Duration.steps(3))
    ours = InLoopPerplexityCallbackConfig.from_olmo_core(theirs, olmo_core_keys_only=True)
    assert (ours.eval_dataset, ours.eval_interval, ours.eval_duration) == (
        theirs.eval_dataset,
        theirs.eval_interval,
        theirs.eval_duration,
    )
    olmo = TrainerConfig(save_folder="unused").with_callback("lm_evaluator", theirs)
    replaced = replace_callback(olmo, "lm_evaluator", ours)
    saved = TrainerConfig.from_dict(replaced.as_config_dict()).callbacks["lm_evaluator"]
    assert isinstance(saved, InLoopPerplexityCallbackConfig) and saved == ours


def test_evaluator_config_follows_olmo_cores_loader(tmp_path):
    """One `documents` domain per metadata label, files in order; OLMo-core's global batch (eval batch per
    rank x data-parallel ranks) and eval_duration."""
    neox = TokenizerConfig.gpt_neox_olmo_dolma_v1_5()
    write_documents(tmp_path / "ppl", neox)
    ours = InLoopPerplexityCallbackConfig.from_olmo_core(olmo_core_config(tmp_path, neox))
    entry = ours.evaluator_config(BATCH_SPEC, dp_world_size=2).evaluators[0]
    assert [d.label for d in entry.domains] == list(DOCUMENTS)
    assert [len(d.paths) for d in entry.domains] == [len(files) for files in DOCUMENTS.values()]
    assert {(d.format, d.dtype, d.eos_token_id) for d in entry.domains} == {("documents", "uint16", 50279)}
    assert (entry.seq_len, entry.loader_batch_instances, entry.loader_max_batches) == (SEQ_LEN, 4, None)
    instances = EvalBatchSpec(rank_batch_size=3, batch_size_unit=EvalBatchSizeUnit.instances)
    assert ours.evaluator_config(instances, dp_world_size=2).evaluators[0].loader_batch_instances == 6
    assert loader_batches(Duration.steps(3), 4, SEQ_LEN) == 3
    assert loader_batches(Duration.tokens(4 * SEQ_LEN + 1), 4, SEQ_LEN) == 2
    assert loader_batches(Duration.epochs(1), 4, SEQ_LEN) is None


def test_refused_configs_say_why(tmp_path):
    neox = TokenizerConfig.gpt_neox_olmo_dolma_v1_5()
    write_documents(tmp_path / "ppl", neox)
    theirs = olmo_core_config(tmp_path, neox)
    with pytest.raises(ConfigError, match=r"fixed_steps=\[5\] is not supported"):
        InLoopPerplexityCallbackConfig(eval_dataset=theirs.eval_dataset, fixed_steps=[5])
    unlabelled = theirs.eval_dataset.metadata[:-1] + [{"name": "code"}]
    dataset = NumpyPaddedFSLDatasetConfig(
        paths=theirs.eval_dataset.paths, metadata=unlabelled, sequence_length=SEQ_LEN, tokenizer=neox
    )
    with pytest.raises(
        ConfigError, match=r"file .*code-validation-0.npy: expected a string 'label' in its metadata"
    ):
        InLoopPerplexityCallbackConfig(eval_dataset=dataset).evaluator_config(BATCH_SPEC, 1)
    paths = theirs.eval_dataset.paths
    interleaved = NumpyPaddedFSLDatasetConfig(
        paths=[paths[0], paths[2], paths[1]],
        metadata=[theirs.eval_dataset.metadata[i] for i in (0, 2, 1)],
        sequence_length=SEQ_LEN,
        tokenizer=neox,
    )
    with pytest.raises(ConfigError, match=r"label 'c4_en-validation': its files are not next to each other"):
        InLoopPerplexityCallbackConfig(eval_dataset=interleaved).evaluator_config(BATCH_SPEC, 1)
    with pytest.raises(
        ConfigError, match="is longer than the train module's maximum eval sequence length 64"
    ):
        InLoopPerplexityCallbackConfig(eval_dataset=theirs.eval_dataset).evaluator_config(
            EvalBatchSpec(rank_batch_size=128, max_sequence_length=64), 1
        )
    with pytest.raises(
        ConfigError, match="eval batch of 200 tokens per rank is not a whole number of sequences"
    ):
        InLoopPerplexityCallbackConfig(eval_dataset=theirs.eval_dataset).evaluator_config(
            EvalBatchSpec(rank_batch_size=200), 1
        )


def test_with_recommended_evals_puts_ours_on_olmo_cores_validation_mix(data_root, tmp_path):
    """`cluster`: OLMo-core's validation mix as it builds it (here gs://, without beaker: not an ai2/ cluster),
    refused when the trainer is built (remote files); `mix_base_dir`: the same mix under a local folder."""
    neox = TokenizerConfig.gpt_neox_olmo_dolma_v1_5()
    base = TrainerConfig(save_folder="unused")
    config = with_recommended_evals(
        base,
        neox,
        SEQ_LEN,
        "somewhere/cluster",
        task_set="fast",
        olmo_core_keys_only=True,
        data_root=str(data_root),
    )
    ours = config.callbacks["lm_evaluator"]
    assert isinstance(ours, InLoopPerplexityCallbackConfig) and list(config.callbacks) == [
        "downstream_evaluator",
        "lm_evaluator",
    ]
    assert (ours.eval_interval, ours.eval_on_finish, ours.olmo_core_keys_only) == (10_000, True, True)
    assert ours.eval_dataset.mix_base_dir == "gs://ai2-llm" and ours.eval_dataset.sequence_length == SEQ_LEN
    with pytest.raises(
        ConfigError, match=r"on remote storage \(gs://ai2-llm/eval-data/perplexity/.*11 in all"
    ):
        ours.evaluator_config(BATCH_SPEC, 1)
    local = with_recommended_evals(base, neox, SEQ_LEN, mix_base_dir=str(tmp_path)).callbacks["lm_evaluator"]
    labels = [d.label for d in local.evaluator_config(BATCH_SPEC, 1).evaluators[0].domains]
    assert len(labels) == 11 and "c4_en-validation" in labels
    with pytest.raises(ConfigError, match="needs OLMo-core's beaker dependency"):
        with_recommended_evals(base, neox, SEQ_LEN, "ai2/jupiter")


def test_olmo_core_keys_only_keeps_olmo_cores_perplexity_keys():
    metrics = {
        "eval/lm/c4/CE loss": 1.0,
        "eval/lm/c4/PPL": 2.7,
        "eval/lm/c4/ce": 1.1,
        "eval/merged/lm/c4/PPL": 2.7,
        "eval/downstream/piqa (accuracy)": 0.5,
        "eval/seconds": 3.0,
    }
    assert recorded(metrics, True) == {
        k: v for k, v in metrics.items() if k not in ("eval/lm/c4/ce", "eval/seconds")
    }


def test_loader_selection_is_olmo_cores_global_indices(tmp_path):
    """OLMo-core's own loader, built on the same files: the indices it keeps for batches of 4 are those
    `loader_selection` keeps."""
    neox = TokenizerConfig.gpt_neox_olmo_dolma_v1_5()
    write_documents(tmp_path / "ppl", neox)
    dataset = olmo_core_config(tmp_path, neox).eval_dataset.build()
    dataset.prepare()
    loader = NumpyDataLoaderBase.wrap_numpy_dataset(
        dataset, global_batch_size=4 * SEQ_LEN, collator=DataCollator(pad_token_id=neox.pad_token_id)
    )
    loader.reshuffle(epoch=1, in_memory=True)
    theirs = np.sort(loader.get_global_indices()[: loader.total_size])
    counts = [n for files in DOCUMENTS.values() for n in files]
    per_label = [sum(files) for files in DOCUMENTS.values()]
    kept = loader_selection(per_label, list(DOCUMENTS), LoaderSelection(4))
    offsets = np.cumsum([0, *per_label])[:-1]
    assert sum(counts) == len(dataset) == N_DOCUMENTS
    assert np.array_equal(
        np.sort(np.concatenate([k + o for k, o in zip(kept, offsets, strict=True)])), theirs
    )


def test_downstream_and_perplexity_callbacks_add_up_their_cost(data_root, tmp_path):
    """Both of our callbacks evaluating at one step (as `with_recommended_evals` installs them) record
    `eval/seconds` and `eval/tokens_forwarded` once each: OLMo-core keeps their sum, not the first."""
    tokenizer = TokenizerConfig.gpt_neox_olmo_dolma_v1_5()
    write_documents(tmp_path / "ppl", tokenizer)
    perplexity = InLoopPerplexityCallbackConfig.from_olmo_core(
        olmo_core_config(tmp_path, tokenizer), data_root=str(data_root)
    )
    downstream = callback_config(data_root, tasks=["piqa"], limit=2, eval_on_finish=False)
    result, trainer = train(
        tmp_path / "run",
        data_root,
        with_callback=True,
        callback=downstream,
        steps=1,
        extra_callbacks={"lm_evaluator": perplexity},
    )
    tokens = [trainer.callbacks[name].evaluator.tokens_forwarded for name in ("inloop_eval", "lm_evaluator")]
    assert min(tokens) > 0
    assert result["logged"]["0"]["eval/tokens_forwarded"] == sum(tokens)
