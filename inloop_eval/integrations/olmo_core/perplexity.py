"""OLMo-core's perplexity evaluation by this project's perplexity evaluator: the fields of OLMo-core's
`LMEvaluatorCallbackConfig` turned into an `lm` evaluator over the same numpy files, whose figures are
OLMo-core's, under OLMo-core's keys `eval/lm/<label>/CE loss` and `eval/lm/<label>/PPL`.

`PerplexityCallbackFields` is OLMo-core's `LMEvaluatorCallbackConfig` (every field, its defaults and its
serialisation) plus this project's own; `inloop_eval.integrations.olmo_core.InLoopPerplexityCallbackConfig`
builds it into the in-loop callback. What OLMo-core's `LMEvaluator` does, and the evaluator therefore does:
- the dataset config's files (its `paths` or data `mix`, labels from their metadata) read as its
  `NumpyPaddedFSLDataset` reads them: each EOS-ended document one sequence of its first `sequence_length`
  tokens (format `documents`, `inloop_eval.data.perplexity.documents`);
- only the sequences its data loader reaches: all files' sequences shuffled by the loader's seed and cut to
  whole global batches (the train module's eval batch times the data-parallel world size), and to
  `eval_duration`; so, as in OLMo-core, which sequences are scored depends on the eval batch and world size;
- per label, CE loss = Σ nll / Σ sequence lengths and PPL = exp(CE loss).
`with_recommended_evals`' validation mix is built as OLMo-core's `TrainerConfig.with_recommended_evals`
builds it (`validation_mix_dataset`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from olmo_core.data import DataMix, NumpyPaddedFSLDataset, NumpyPaddedFSLDatasetConfig, TokenizerConfig
from olmo_core.io import is_url
from olmo_core.train.callbacks import LMEvaluatorCallbackConfig
from olmo_core.train.common import Duration, DurationUnit
from olmo_core.train.train_module import EvalBatchSizeUnit, EvalBatchSpec

from inloop_eval.data.perplexity.domain_config import LM_DTYPES
from inloop_eval.errors import ConfigError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.perplexity import LMEvalConfig
from inloop_eval.integrations.callback_config import check_trained_length

# The name OLMo-core's `with_recommended_evals` gives its perplexity callback.
OLMO_CORE_PERPLEXITY_CALLBACK = "lm_evaluator"
# OLMo-core's validation mix in `with_recommended_evals`.
VALIDATION_MIX = DataMix.v3_small_ppl_validation
# This project's fields that apply to the perplexity callback too (`with_recommended_evals` passes them on).
SHARED_FIELDS = ("olmo_core_keys_only", "strict", "data_root")
DEFAULT_BATCH_TOKENS = LMEvalConfig.__dataclass_fields__["batch_tokens"].default
WHERE = "InLoopPerplexityCallbackConfig"


@dataclass
class PerplexityCallbackFields(LMEvaluatorCallbackConfig):
    """OLMo-core's `LMEvaluatorCallbackConfig` fields (`eval_dataset`, `eval_interval`, `eval_on_startup`,
    `eval_on_finish`, `eval_duration`, `enabled`, ...), with the same meaning, plus this project's."""

    batch_tokens: int = DEFAULT_BATCH_TOKENS
    """Token budget of one forward pass (at least the dataset's `sequence_length`, which it is raised to)."""
    olmo_core_keys_only: bool = False
    """Record only OLMo-core's keys (`eval/lm/<label>/CE loss`, `PPL`) and the evaluation time; our `ce`,
    `ppl`, `bpb` under `eval/lm/<label>/...` are computed but not recorded."""
    strict: bool = False
    """Raise a label's failure (stopping training) instead of recording `eval/lm/<label>/failed = 1`."""
    data_root: str | None = None
    """Where `inloop-eval data fetch` put the tokenizers (for bits per byte); default `$INLOOP_EVAL_DATA`."""

    def __post_init__(self) -> None:
        refused = {
            "fixed_steps": (self.fixed_steps, None),
            "cancel_after_first_eval": (self.cancel_after_first_eval, False),
            "deterministic": (self.deterministic, True),
        }
        for name, (value, supported) in refused.items():
            if value != supported:
                raise ConfigError(
                    f"{WHERE}: {name}={value!r} is not supported (only {supported!r}); keep OLMo-core's "
                    "LMEvaluatorCallbackConfig for it"
                )
        if self.eval_interval is None or self.eval_interval < 1:
            raise ConfigError(
                f"{WHERE}: eval_interval must be a positive number of steps, found {self.eval_interval!r}"
            )
        if self.batch_tokens < 1:
            raise ConfigError(f"{WHERE}: batch_tokens must be >= 1, found {self.batch_tokens}")

    @classmethod
    def from_olmo_core(cls, config: LMEvaluatorCallbackConfig, **fields: Any) -> Any:
        """This config with every field of OLMo-core's `config`, and this project's `fields`."""
        names = [f.name for f in dataclasses.fields(LMEvaluatorCallbackConfig) if f.init]
        return cls(**{name: getattr(config, name) for name in names}, **fields)

    def evaluator_config(self, batch_spec: EvalBatchSpec, dp_world_size: int) -> EvaluatorConfig:
        """The `lm` evaluator config of `eval_dataset` for a train module's eval batch and data-parallel world
        size (OLMo-core's global eval batch is their product)."""
        dataset = self.eval_dataset.build()
        if not isinstance(dataset, NumpyPaddedFSLDataset):
            raise ConfigError(
                f"{WHERE}: eval_dataset must build a padded FSL dataset (NumpyPaddedFSLDatasetConfig), found "
                f"{type(dataset).__name__}"
            )
        seq_len = dataset.sequence_length
        check_trained_length(
            WHERE,
            "the eval dataset's sequence_length",
            seq_len,
            batch_spec.max_sequence_length,
            "the train module's maximum eval sequence length",
            fix="build the eval dataset with a shorter sequence_length",
        )
        batch_instances = global_batch_instances(batch_spec, seq_len, dp_world_size)
        entry = {
            "type": "lm",
            "domains": documents_domains(self.eval_dataset, dataset),
            "seq_len": seq_len,
            "batch_tokens": max(self.batch_tokens, seq_len),
            "loader_batch_instances": batch_instances,
            "loader_max_batches": loader_batches(self.eval_duration, batch_instances, seq_len),
        }
        settings = {
            "eval_interval": self.eval_interval,
            "key_style": "olmo_core",
            "strict": self.strict,
            "data_root": self.data_root,
            "max_length": batch_spec.max_sequence_length,
        }
        return EvaluatorConfig.from_dict({"evaluators": [entry], **settings}, WHERE)


def global_batch_instances(batch_spec: EvalBatchSpec, seq_len: int, dp_world_size: int) -> int:
    """Sequences per global batch of OLMo-core's eval data loader, as its `LMEvaluatorCallbackConfig`
    computes them from the train module's eval batch (tokens or instances per rank) and the world size."""
    if batch_spec.batch_size_unit == EvalBatchSizeUnit.instances:
        return batch_spec.rank_batch_size * dp_world_size
    if batch_spec.rank_batch_size % seq_len:
        raise ConfigError(
            f"{WHERE}: the train module's eval batch of {batch_spec.rank_batch_size} tokens per rank is not a "
            f"whole number of sequences of {seq_len} tokens (OLMo-core's data loader refuses it too)"
        )
    return batch_spec.rank_batch_size // seq_len * dp_world_size


def loader_batches(duration: Duration, batch_instances: int, seq_len: int) -> int | None:
    """The batches after which OLMo-core's evaluation loop stops (`eval_duration.due` after each batch, its
    epoch 1 and its tokens counted over all ranks); None: the whole epoch."""
    if duration.unit == DurationUnit.epochs:
        return None if duration.value >= 1 else 1
    if duration.unit == DurationUnit.steps:
        return max(1, int(duration.value))
    return max(1, math.ceil(duration.value / (batch_instances * seq_len)))


def documents_domains(config: Any, dataset: NumpyPaddedFSLDataset) -> list[dict[str, Any]]:
    """One `documents` domain per label of the dataset's metadata, its files in the dataset's order."""
    for name in ("label_mask_paths", "instance_filter_config"):
        if getattr(config, name, None) is not None:
            raise ConfigError(
                f"{WHERE}: eval_dataset.{name} is not supported; keep OLMo-core's LMEvaluatorCallbackConfig for it"
            )
    dtype = np.dtype(dataset.dtype).name
    if dtype not in LM_DTYPES:
        raise ConfigError(f"{WHERE}: the eval dataset's token dtype {dtype} is not one of {list(LM_DTYPES)}")
    remote = [str(p) for p in dataset.paths if is_url(p)]
    if remote:
        raise ConfigError(
            f"{WHERE}: the eval dataset's files are on remote storage ({remote[0]}, {len(remote)} in all), and "
            "this evaluator reads local files only (no network while training); copy them to a local or mounted "
            "folder and point the dataset there (`mix_base_dir`, or `paths`), or keep OLMo-core's "
            "LMEvaluatorCallbackConfig for remote data"
        )
    paths_by_label: dict[str, list[str]] = {}
    previous = None
    for path, metadata in zip(dataset.paths, dataset.metadata, strict=True):
        label = metadata.get("label") if isinstance(metadata, dict) else None
        if not isinstance(label, str):
            raise ConfigError(
                f"{WHERE}: eval dataset file {path}: expected a string 'label' in its metadata, found "
                f"{metadata!r}"
            )
        if label in paths_by_label and label != previous:
            raise ConfigError(
                f"{WHERE}: eval dataset label {label!r}: its files are not next to each other in the dataset's "
                f"paths ({path} follows a file of {previous!r}); list each label's files together"
            )
        paths_by_label.setdefault(label, []).append(str(path))
        previous = label
    return [
        {
            "label": label,
            "paths": paths,
            "format": "documents",
            "dtype": dtype,
            "eos_token_id": dataset.eos_token_id,
        }
        for label, paths in paths_by_label.items()
    ]


def validation_mix_dataset(
    tokenizer: TokenizerConfig, sequence_length: int, *, cluster: str | None, mix_base_dir: str | None
) -> NumpyPaddedFSLDatasetConfig:
    """OLMo-core's validation mix (`DataMix.v3_small_ppl_validation`) as `TrainerConfig.with_recommended_evals`
    builds it: under the cluster's storage root (`olmo_core.internal.common.get_root_dir`, asked through
    its beaker dependency for `ai2/` clusters), or under `mix_base_dir` (a local copy) when given."""
    if mix_base_dir is not None:
        root, work_dir = mix_base_dir, None
    elif cluster is not None:
        root, work_dir = cluster_storage(cluster)
    else:
        raise ConfigError("with_recommended_evals: the validation mix needs `cluster` or `mix_base_dir`")
    return NumpyPaddedFSLDatasetConfig.from_data_mix(
        VALIDATION_MIX,
        mix_base_dir=root,
        sequence_length=sequence_length,
        tokenizer=tokenizer,
        work_dir=work_dir,
    )


def cluster_storage(cluster: str) -> tuple[str, str]:
    """(storage root, dataset work folder) of `cluster`, as OLMo-core's `with_recommended_evals` finds them."""
    try:
        from olmo_core.internal.common import get_root_dir, get_work_dir
    except ImportError as error:  # its `beaker` dependency is not installed
        if cluster.startswith("ai2/"):
            raise ConfigError(
                f"with_recommended_evals: finding cluster {cluster!r}'s storage needs OLMo-core's beaker "
                f"dependency ({error}); install `beaker-py`, or pass mix_base_dir= (the folder holding "
                "eval-data/perplexity/)"
            ) from error
        # What OLMo-core's helpers answer for any other cluster, without asking beaker.
        return "gs://ai2-llm", "./dataset-cache"
    root = get_root_dir(cluster)
    return root, get_work_dir(root)
