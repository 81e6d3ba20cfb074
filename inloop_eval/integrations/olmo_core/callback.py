"""An OLMo-core trainer callback that runs the in-loop evaluator every `eval_interval` steps.

    trainer_config = trainer_config.with_callback(
        "inloop_eval",
        InLoopEvalCallbackConfig(tasks=["piqa", "arc_easy_rc_5shot"], tokenizer=tokenizer_config, eval_interval=1000),
    )

A trainer config that already holds OLMo-core's `downstream_evaluator` swaps it in one line,
`replace_callback(trainer_config, "downstream_evaluator", InLoopEvalCallbackConfig(...))`; OLMo-core's task
sets are `task_set="fast"` (or `with_recommended_evals(trainer_config, tokenizer, task_set="fast")`).
OLMo-core's perplexity callback is replaced the same way by `InLoopPerplexityCallbackConfig` (OLMo-core's
`LMEvaluatorCallbackConfig` fields; `.from_olmo_core(config)`), its figures OLMo-core's under OLMo-core's
keys `eval/lm/<label>/CE loss` and `PPL` (`inloop_eval.integrations.olmo_core.perplexity`). To
OLMo-core the callback is an `EvaluatorCallback`: `Trainer.eval_checkpoints()` and `ModelMergeCallback` (the
merged weights' figures under `eval/merged/...`) run it, `no_evals=True` switches it off, and the last step it
evaluated is saved in OLMo-core's checkpoints, so a resumed run evaluates no step twice.

`InLoopEvalCallbackConfig` holds plain fields only, so `TrainerConfig.with_callback`'s deep copy and the saved
trainer config keep it whole; the evaluator is built in `build`, when the trainer exists. The callback takes
the tokenizer from OLMo's `TokenizerConfig` (its BOS and EOS ids included), the context length from the train
module, runs the model under the train module's autocast, and records the figures through
`trainer.record_metric` (already synced across ranks: recorded without reduction) plus its wall time in
OLMo-core's `throughput/in-loop eval time (s)`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from abc import abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from olmo_core.data import TokenizerConfig
from olmo_core.distributed.utils import get_world_size
from olmo_core.eval.task_groups import TASK_GROUPS
from olmo_core.train import TrainerConfig
from olmo_core.train.callbacks import Callback, CallbackConfig, EvaluatorCallback
from olmo_core.train.common import MetricMergeStrategy
from olmo_core.train.train_module import TransformerPipelineTrainModule

from inloop_eval.config_fields import one_of
from inloop_eval.data.root import default_data_root
from inloop_eval.data.tokenizer import Tokenizer, with_special_ids
from inloop_eval.data.tokenizer_lookup import find_and_load_tokenizer
from inloop_eval.engine.adapter import refuse_model
from inloop_eval.errors import ConfigError, UnknownTaskError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.integrations import EvalSchedule, run_and_log
from inloop_eval.integrations.callback_config import TaskCallbackFields
from inloop_eval.integrations.olmo_core.keys import EVAL_TIME_KEY, is_olmo_core_key
from inloop_eval.integrations.olmo_core.perplexity import (
    OLMO_CORE_PERPLEXITY_CALLBACK,
    SHARED_FIELDS,
    PerplexityCallbackFields,
    validation_mix_dataset,
)
from inloop_eval.integrations.olmo_core.topology import read_sequence_split
from inloop_eval.keys import PREFIX, interval_key, key_style_names, seconds_key, tokens_key
from inloop_eval.tasks.registry import check_task_id

# The name OLMo-core's `with_recommended_evals` and experiment builder give their downstream evaluator.
OLMO_CORE_DOWNSTREAM_CALLBACK = "downstream_evaluator"
# Our task ids of OLMo's in-loop labels: `olmo:<label>`.
OLMO_TASK_PREFIX = "olmo:"


class InLoopCallbackBuild(CallbackConfig):
    """The `build` of both OLMo-core callback configs of ours (downstream tasks, perplexity): the evaluator
    of `evaluator_config_of(trainer)` with the tokenizer of `tokenizer_config()`, in an `InLoopEvalCallback`.
    Its subclasses are dataclasses holding `enabled`, `eval_on_startup`, `eval_on_finish`,
    `olmo_core_keys_only` and `data_root`."""

    enabled: bool
    eval_on_startup: bool
    eval_on_finish: bool
    olmo_core_keys_only: bool
    data_root: str | None

    @abstractmethod
    def evaluator_config_of(self, trainer: Any) -> EvaluatorConfig:
        """The evaluator config for `trainer` (its train module's sequence length, its world size)."""

    @abstractmethod
    def tokenizer_config(self) -> TokenizerConfig | None:
        """OLMo's tokenizer config of the model (None: the evaluator config's `tokenizer:`)."""

    def build(self, trainer: Any) -> Callback | None:
        if not self.enabled:
            return None
        train_module = trainer.train_module
        check_train_module(train_module)
        root = Path(self.data_root).expanduser() if self.data_root else default_data_root()
        tokenizer_config = self.tokenizer_config()
        tokenizer = olmo_tokenizer(tokenizer_config, root) if tokenizer_config is not None else None
        config = self.evaluator_config_of(trainer)
        check_sequence_split(config.max_length, getattr(train_module, "model", None))
        evaluator = InLoopEvaluator(config, tokenizer=tokenizer)
        return InLoopEvalCallback(
            evaluator,
            autocast=getattr(train_module, "autocast_precision", None),
            eval_on_startup=self.eval_on_startup,
            eval_on_finish=self.eval_on_finish,
            olmo_core_keys_only=self.olmo_core_keys_only,
        )


@dataclass
class InLoopEvalCallbackConfig(InLoopCallbackBuild, TaskCallbackFields):
    """The OLMo-core callback config of the in-loop evaluator: what to evaluate and when, in plain fields.
    Name either `tasks`, a `task_set` or a `config` file (the fields shared with torchtitan's validator are
    `TaskCallbackFields`')."""

    task_set: str | None = None
    """One of OLMo-core's task sets (`full`, `full__small_compute`, `full__large_compute`, `fast`), instead of
    `tasks`: its labels as `olmo:<label>` tasks (`task_set_ids`)."""
    tokenizer: TokenizerConfig | None = None
    """OLMo's tokenizer config: its `identifier` is a local tokenizer file or directory, a tokenizer
    `inloop-eval data fetch` fetched, or one in the local Hugging Face hub cache; its BOS and EOS ids are used
    as given. None: the config file's `tokenizer:`."""
    eval_interval: int = 1000
    """Evaluate after every step divisible by this (a `config` file's `eval_interval` is replaced by it)."""
    eval_on_startup: bool = False
    """Evaluate before the first step (at the step a resumed run starts from)."""
    eval_on_finish: bool = False
    """Evaluate after the last step (unless that step was just evaluated)."""
    enabled: bool = True
    """False: `build` returns no callback."""
    key_style: str = "inloop"
    """Metric key names: `inloop`, or `olmo_core` (an `olmo:` task's OLMo figures under OLMo-core's keys)."""
    olmo_core_keys_only: bool = False
    """Record only the keys OLMo-core's own downstream callback records (with `key_style: olmo_core`): the
    OLMo figures of `olmo:` tasks, and the evaluation time; our other figures are computed but not recorded."""

    TASK_SOURCES: ClassVar[dict[str, str]] = {
        "tasks": "e.g. tasks=['piqa']",
        "task_set": "one of OLMo-core's, e.g. 'fast'",
        "config": "an evaluator YAML file",
    }
    TASK_ONLY_FIELDS: ClassVar[tuple[str, ...]] = ("limit", "batch_tokens", "key_style")

    def __post_init__(self) -> None:
        TaskCallbackFields.__post_init__(self)
        if self.task_set is not None:
            task_set_ids(self.task_set)
        if self.tokenizer is None and self.config is None:
            raise ConfigError(
                f"{self.where}: `tokenizer` is required with `tasks`: OLMo's TokenizerConfig of the model, "
                "e.g. TokenizerConfig.gpt_neox_olmo_dolma_v1_5()"
            )
        one_of(self.key_style, key_style_names(), f"{self.where}: key_style")
        if self.olmo_core_keys_only and self.key_style != "olmo_core" and self.config is None:
            raise ConfigError(
                f"{self.where}: olmo_core_keys_only=True needs key_style='olmo_core' (only then do OLMo's "
                f"figures take OLMo-core's keys), found key_style={self.key_style!r}"
            )

    def task_ids(self) -> list[str]:
        """The task ids `tasks` or `task_set` names (none with `config`)."""
        if self.task_set is not None:
            return task_set_ids(self.task_set)
        return list(self.tasks or [])

    def task_settings(self) -> dict[str, Any]:
        return {"key_style": self.key_style}

    def evaluator_config(self, max_sequence_length: int | None) -> EvaluatorConfig:
        """The `EvaluatorConfig` this callback config describes, its `max_length` the train module's
        sequence length (a config file may only lower it)."""
        return self.described_config(
            eval_interval=self.eval_interval,
            trained_length=max_sequence_length,
            trained_length_name="the train module's max_sequence_length",
        )

    def evaluator_config_of(self, trainer: Any) -> EvaluatorConfig:
        spec = getattr(trainer.train_module, "eval_batch_spec", None)
        return self.evaluator_config(getattr(spec, "max_sequence_length", None))

    def tokenizer_config(self) -> TokenizerConfig | None:
        return self.tokenizer


@dataclass
class InLoopPerplexityCallbackConfig(InLoopCallbackBuild, PerplexityCallbackFields):
    """OLMo-core's `LMEvaluatorCallbackConfig`, the same fields, evaluated by this project's perplexity
    evaluator with OLMo-core's figures and keys (`inloop_eval.integrations.olmo_core.perplexity`):

        olmo = trainer_config.callbacks["lm_evaluator"]
        trainer_config = replace_callback(
            trainer_config, "lm_evaluator", InLoopPerplexityCallbackConfig.from_olmo_core(olmo)
        )
    """

    def evaluator_config_of(self, trainer: Any) -> EvaluatorConfig:
        dp_world_size = get_world_size(getattr(trainer, "dp_process_group", None))
        return self.evaluator_config(trainer.train_module.eval_batch_spec, dp_world_size)

    def tokenizer_config(self) -> TokenizerConfig | None:
        return self.eval_dataset.tokenizer


class InLoopEvalCallback(EvaluatorCallback):
    """Evaluates the train module's model after every step that `evaluator.should_run` accepts, and before
    the first / after the last step when asked; never twice at one step.

    An `EvaluatorCallback` to OLMo-core: `Trainer.eval_checkpoints()` and `ModelMergeCallback` call its
    `perform_eval` (the merged weights' figures under `eval/merged/...`), and `TrainerConfig(no_evals=True)`
    switches it off. It evaluates in `post_train_batch` with a priority above the `CheckpointerCallback`'s,
    so a checkpoint saved at a step knows that step's evaluation (`state_dict`): a run resumed from it never
    evaluates that step again.

    autocast: the train module's autocast dtype; the evaluator's forward runs under it, as training's does.
    olmo_core_keys_only: record only the keys OLMo-core's own downstream callback would (`recorded`).
    """

    # Above the CheckpointerCallback (1): this step's evaluation runs before its checkpoint is saved.
    priority: ClassVar[int] = 2

    def __init__(
        self,
        evaluator: InLoopEvaluator,
        *,
        autocast: torch.dtype | None = None,
        eval_on_startup: bool = False,
        eval_on_finish: bool = False,
        olmo_core_keys_only: bool = False,
    ) -> None:
        # OLMo-core's fields, for whatever reads them (its own `evaluators` stay empty: ours runs `evaluator`).
        super().__init__(
            eval_interval=evaluator.config.eval_interval,
            eval_on_startup=eval_on_startup,
            eval_on_finish=eval_on_finish,
        )
        self.evaluator = evaluator
        self.olmo_core_keys_only = olmo_core_keys_only
        self.autocast = autocast
        self.schedule = EvalSchedule(evaluator)

    def post_attach(self) -> None:
        """Any train module whose `model` the evaluator can run (OLMo-core's check for transformer train
        modules is its own evaluators' need)."""

    def pre_train(self) -> None:
        if self.eval_on_startup and self.schedule.due(self.step, forced=True):
            self.perform_eval()

    def post_train_batch(self) -> None:
        if self.schedule.due(self.step):
            self.perform_eval()

    def post_step(self) -> None:
        """Nothing: the step's evaluation ran in `post_train_batch`, before its checkpoint."""

    def post_train(self) -> None:
        if self.eval_on_finish and self.schedule.due(self.step, forced=True):
            self.perform_eval()

    def state_dict(self) -> dict[str, Any]:
        """Saved in OLMo-core's checkpoint: the last step evaluated (None: none yet)."""
        return {"last_evaluated_step": self.schedule.last_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.schedule.last_step = state_dict.get("last_evaluated_step")

    def perform_eval(self, prefix: str = PREFIX) -> None:
        """Run the evaluator at the trainer's step and record every figure for that step, under `prefix`
        (`eval/merged` when OLMo-core's `ModelMergeCallback` asks, as it asks its own evaluator callbacks).
        Unconditional: the schedule is the hooks' business (`eval_checkpoints` calls this after loading a
        checkpoint whose step was evaluated while training)."""
        step = self.step
        train_module = self.trainer.train_module
        # Tensor and context parallel peers must score the same documents: shard them over the train
        # module's data-parallel group (None without a world mesh: one process, or the whole world).
        dp_group = getattr(train_module, "dp_process_group", None)
        with self.autocast_context():
            metrics = run_and_log(self.evaluator, train_module.model, step, prefix=prefix, dp_group=dp_group)
        # The cost keys are shared by every callback of ours evaluating at this step (downstream and
        # perplexity): they add up, as OLMo-core's own evaluation time does, instead of colliding.
        cost_keys = {seconds_key(prefix), tokens_key(prefix)}
        for key, value in recorded(metrics, self.olmo_core_keys_only).items():
            # Synced across ranks by the evaluator already: OLMo-core must not reduce them again. Each
            # callback's interval since its own last evaluation also holds the others' evaluations: the
            # least of them is the nearest to the training between evaluations.
            strategy = MetricMergeStrategy.warn
            if key in cost_keys:
                strategy = MetricMergeStrategy.sum
            elif key == interval_key(prefix):
                strategy = MetricMergeStrategy.min
            self.trainer.record_metric(key, value, reduce_type=None, merge_strategy=strategy)
        self.trainer.record_metric(
            EVAL_TIME_KEY, metrics[seconds_key(prefix)], merge_strategy=MetricMergeStrategy.sum
        )

    @contextlib.contextmanager
    def autocast_context(self) -> Iterator[None]:
        """The train module's autocast (as its `model_forward` enters it), or nothing."""
        if self.autocast is None:
            yield
            return
        with torch.autocast(self.trainer.device.type, dtype=self.autocast):
            yield


def check_train_module(train_module: Any) -> None:
    """Refused (`refuse_model`), when the trainer is built, for a train module the callback cannot evaluate:
    OLMo-core's pipeline-parallel one, whose model exists only as stages that its own schedule runs (its
    `model` raises, its `eval_batch` does not support inference)."""
    if isinstance(train_module, TransformerPipelineTrainModule):
        refuse_model(
            "an OLMo-core TransformerPipelineTrainModule (pipeline parallel)",
            "InLoopEvalCallback does not evaluate yet: its model exists only as stages run by OLMo-core's "
            "own schedules, which need CUDA",
            "leave the callback out of pipeline-parallel runs, or evaluate from your own loop with "
            "inloop_eval.engine.adapters.pipeline.PipelineAdapter over a torch.distributed.pipelining schedule",
        )


def check_sequence_split(max_length: int | None, model: Any) -> None:
    """ConfigError, when the trainer is built, for a `max_length` that the model's split of the sequence over
    tensor- and context-parallel ranks cannot take (every batch must be a multiple of TP x CP wide, and
    none may be wider than `max_length`), naming the lengths that can."""
    split = read_sequence_split(model) if model is not None else None
    if split is None or max_length is None or max_length % split.multiple == 0:
        return
    lower = max_length - max_length % split.multiple
    raise ConfigError(
        f"InLoopEvalCallback: max_length {max_length} is not a multiple of {split.multiple} (tensor parallel "
        f"{split.tp_size} x context parallel {split.cp_size}), which the model's split of the sequence needs; "
        f"set the evaluator's max_length to {lower}, or train with a max_sequence_length that is a multiple of "
        f"{split.multiple}"
    )


def replace_callback(trainer_config: TrainerConfig, name: str, callback: Callback) -> TrainerConfig:
    """A copy of `trainer_config` with its callback `name` replaced by `callback` (`with_callback` refuses a
    name already taken), e.g. OLMo-core's downstream evaluator by this project's:

        trainer_config = replace_callback(trainer_config, "downstream_evaluator", InLoopEvalCallbackConfig(...))
    """
    if name not in trainer_config.callbacks:
        raise ConfigError(
            f"replace_callback: the trainer config has no callback {name!r} to replace (it has "
            f"{sorted(trainer_config.callbacks)}); add it with `trainer_config.with_callback({name!r}, ...)`"
        )
    out = dataclasses.replace(trainer_config, callbacks=copy.deepcopy(trainer_config.callbacks))
    out.callbacks[name] = callback
    return out


def task_set_ids(task_set: str) -> list[str]:
    """Our task ids (`olmo:<label>`, sorted) for exactly the labels of OLMo-core's `TASK_GROUPS[task_set]`
    (`full`, `full__small_compute`, `full__large_compute`, `fast`)."""
    if task_set not in TASK_GROUPS:
        raise ConfigError(f"task_set {task_set!r} is not one of OLMo-core's task sets {sorted(TASK_GROUPS)}")
    ids = sorted(f"{OLMO_TASK_PREFIX}{label}" for label in TASK_GROUPS[task_set])
    for task_id in ids:
        try:
            check_task_id(task_id)
        except UnknownTaskError as error:
            raise ConfigError(
                f"task_set {task_set!r}: OLMo-core's label {task_id[len(OLMO_TASK_PREFIX) :]!r} has no task "
                f"{task_id!r} here ({error}); name the set's other labels in `tasks` instead"
            ) from error
    return ids


def with_recommended_evals(
    trainer_config: TrainerConfig,
    tokenizer: TokenizerConfig,
    sequence_length: int | None = None,
    cluster: str | None = None,
    task_set: str = "full",
    eval_interval: int = 10_000,
    lazy_load: bool = False,
    mix_base_dir: str | None = None,
    **callback_fields: Any,
) -> TrainerConfig:
    """`trainer_config.with_recommended_evals(...)` with this project's downstream callback: under OLMo-core's
    name `downstream_evaluator`, the labels of OLMo-core's `TASK_GROUPS[task_set]` as `olmo:<label>` tasks
    (`task_set=` in its config),
    their figures under OLMo-core's keys (`key_style="olmo_core"`), evaluated every `eval_interval` steps
    and after the last.

    cluster: given, the perplexity callback `lm_evaluator` too, this project's (`InLoopPerplexityCallbackConfig`)
    on OLMo-core's validation mix for the cluster at `sequence_length`, built as OLMo-core builds it (its
    storage root found through OLMo-core's beaker dependency for `ai2/` clusters); None, no perplexity callback.
    mix_base_dir: the validation mix under this folder instead (a local copy), with or without `cluster`.
    lazy_load: accepted for OLMo-core's signature (task data is read at the first evaluation anyway).
    callback_fields: more `InLoopEvalCallbackConfig` fields (e.g. `limit`, `olmo_core_keys_only`,
    `data_root`); `olmo_core_keys_only`, `strict` and `data_root` apply to the perplexity callback too.
    """
    del lazy_load
    fields: dict[str, Any] = {"key_style": "olmo_core", "eval_on_finish": True, **callback_fields}
    downstream = InLoopEvalCallbackConfig(
        task_set=task_set, tokenizer=tokenizer, eval_interval=eval_interval, **fields
    )
    with_downstream = trainer_config.with_callback(OLMO_CORE_DOWNSTREAM_CALLBACK, downstream)
    if cluster is None and mix_base_dir is None:
        return with_downstream
    if sequence_length is None:
        raise ConfigError(
            "with_recommended_evals: `sequence_length` is required with `cluster` or `mix_base_dir` (the validation mix)"
        )
    mix = validation_mix_dataset(tokenizer, sequence_length, cluster=cluster, mix_base_dir=mix_base_dir)
    shared = {name: value for name, value in callback_fields.items() if name in SHARED_FIELDS}
    perplexity = InLoopPerplexityCallbackConfig(
        eval_dataset=mix, eval_interval=eval_interval, eval_on_finish=True, **shared
    )
    return with_downstream.with_callback(OLMO_CORE_PERPLEXITY_CALLBACK, perplexity)


def recorded(metrics: dict[str, float], olmo_core_keys_only: bool) -> dict[str, float]:
    """The figures the callback records: all of them, or only those under OLMo-core's own keys."""
    if not olmo_core_keys_only:
        return metrics
    return {key: value for key, value in metrics.items() if is_olmo_core_key(key)}


def olmo_tokenizer(config: TokenizerConfig, data_root: Path) -> Tokenizer:
    """The tokenizer OLMo's `config` names, with its BOS and EOS ids as given. Its `identifier` is found on this
    machine, never downloaded: a local file or directory, a tokenizer `inloop-eval data fetch` put in
    `<data_root>/tokenizers/`, or one in the local Hugging Face hub cache (`find_and_load_tokenizer`)."""
    base = find_and_load_tokenizer(config.identifier, data_root)
    return with_special_ids(
        base, bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, name=config.identifier
    )
