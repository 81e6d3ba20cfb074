"""The whole evaluator config: the list of evaluators (each kind's own config class, `kinds.EntryConfig`) and
the settings they share; logged whole with each run."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from torch.distributed import ProcessGroup

from inloop_eval.config_fields import (
    AtLeast,
    build_dataclass,
    check_fields,
    check_label,
    one_of,
    read_config_file,
    repeated,
    shown,
)
from inloop_eval.data.root import default_data_root
from inloop_eval.data.tokenizer import TokenizerLike
from inloop_eval.data.tokenizer_lookup import find_and_load_tokenizer
from inloop_eval.engine.adapter import AdapterNeeds, ModelAdapter, TokenCount
from inloop_eval.engine.batching import BatchShape
from inloop_eval.engine.evaluation import EvalContext
from inloop_eval.engine.prefix_sharing import attention_tokens_for
from inloop_eval.engine.tree_attention import MASK_RENDERINGS, block_kernel, mask_rendering
from inloop_eval.errors import ConfigError
from inloop_eval.evaluators.downstream import TaskEvalConfig
from inloop_eval.evaluators.kinds import KINDS, EntryConfig
from inloop_eval.keys import key_style_names
from inloop_eval.metrics.registry import METRICS, canonical


@dataclass(kw_only=True)
class SuiteAverageConfig:
    """An average over named tasks, each centred on its chance level (`inloop_eval.metrics.suite`), logged as
    `eval/suite/<label>/centered_acc` with its `_stderr`, and paired by `inloop-eval compare` like any figure."""

    label: str
    """Its name in keys (`eval/suite/<label>/...`), e.g. `core`."""
    tasks: list[str]
    """Labels of downstream evaluators of the config (at least one); the average weighs each task alike."""
    figure: str = "acc"
    """The accuracy-type figure (0 or 1 per document) each task contributes, e.g. `acc` or `acc_norm`; every
    named task must report it."""

    def __post_init__(self) -> None:
        check_fields(self, f"suite_average {shown(self.label)}")
        check_label(self.label, "suite_average")
        where = f"suite_average {self.label!r}"
        if not self.tasks:
            raise ConfigError(f"{where}: `tasks` names no task; list the labels of the tasks to average")
        if repeated(self.tasks):
            raise ConfigError(f"{where}: tasks named twice: {repeated(self.tasks)}")
        definition = METRICS.get(canonical(self.figure))
        if definition is None or not definition.binary:
            raise ConfigError(
                f"{where}: figure {self.figure!r} is not an accuracy-type figure (0 or 1 per document); "
                "use `acc`, `acc_norm` or another accuracy"
            )


def flat_settings(value: Any, path: str = "") -> dict[str, Any]:
    """`value` (nested mappings and lists of JSON-able leaves) as leaf path -> value, e.g.
    `{"evaluators[0].limit": 20, "evaluators.count": 1}`."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flat_settings(item, f"{path}.{key}" if path else str(key)))
        return out
    if isinstance(value, list):
        out = {f"{path}.count": len(value)}
        for i, item in enumerate(value):
            out.update(flat_settings(item, f"{path}[{i}]"))
        return out
    return {path: value}


@dataclass(kw_only=True)
class EvaluatorConfig:
    """Everything `InLoopEvaluator` needs; logged whole with each run."""

    evaluators: list[EntryConfig] = field(default_factory=list)
    """The evaluators to run at each evaluation, in order: tasks (`type: downstream`, the default) and
    domain perplexity (`type: lm`). A config read from YAML or a dict must list at least one; an empty list
    is allowed only in code, to be filled in later."""
    eval_interval: Annotated[int, AtLeast(1)] = 1000
    """`should_run(step)` is true when `step % eval_interval == 0`."""
    tokenizer: str | None = None
    """The tokenizer (unless one is passed in): a `tokenizers` JSON file or a Hugging Face tokenizer directory, a
    tokenizer `inloop-eval data fetch` fetched (by its repository, e.g. `allenai/dolma2-tokenizer`), or any
    repository whose `tokenizer.json` is in the local Hugging Face hub cache; never downloaded."""
    data_root: str | None = None
    """Local task data in OLMo's folders; default `$INLOOP_EVAL_DATA` or `~/.cache/inloop_eval/data`."""
    max_length: Annotated[int, AtLeast(2)] | None = None
    """Longest input in tokens; default: the model's own (position embeddings), else 2048."""
    strict: bool = False
    """Re-raise an evaluator's failure instead of reporting `failed = 1` under its labels
    (`eval/downstream/<label>/failed`, `eval/lm/<label>/failed`)."""
    pad_to_multiple: Annotated[int, AtLeast(1)] = 1
    """Round every batch's width up to a multiple of this many tokens (bucketed shapes, so a model whose
    forward is compiled sees a few widths rather than one per batch); 1 is off. An adapter that needs widths
    of a multiple of its own (a sequence split over ranks) gets their least common multiple."""
    share_prefixes: bool = True
    """For models that take packed rows: every request's own row is a path of one prefix trie, each token
    forwarded once per row it is in (a task's few-shot examples once for several documents, a document's
    choices' common first tokens once), at the position and with the attention it has in its own row (the
    numbers do not change). false: each context shared by its own continuations only."""
    keep_prefixes: bool = True
    """With `share_prefixes`, for models that keep a prefix's keys and values (the reference GPT, the
    Hugging Face and OLMo-core models that pack): a prefix many rows begin with (the shots) is forwarded
    once and attended to by every row after it, batch after batch. false: it is forwarded once per row."""
    attention_tokens: Annotated[int, AtLeast(1)] | None = None
    """The row length at which attention over a row costs as much as the rest of the forward, for the
    planner's row cost model (how long rows sharing a prefix grow); null: the device's default
    (`prefix_sharing.ATTENTION_COST_TOKENS_BY_DEVICE`: 512 on CPU; `benchmarks/prefix_sharing.py
    --attention-tokens` compares values)."""
    attention_mask: str = "auto"
    """How a packed batch's mask reaches the engine's attention (`engine/tree_attention.py`): `dense`, a boolean
    [B, 1, T, T] mask for PyTorch SDPA; `block`, a FlexAttention block mask, memory by blocks and empty blocks
    skipped; `auto` (the default): block on CUDA, dense elsewhere."""
    compile_attention: bool | None = None
    """Whether the block mask's FlexAttention runs compiled (fused, one graph per sequence length of a fixed
    ladder: `engine/flex_kernel.py`) or eager (unfused: every score materialised). null (the default):
    compiled on CUDA, eager elsewhere; true on CPU compiles it with inductor as CUDA does (a check of the
    GPU path: tens of seconds per graph)."""
    compiler_reset: bool = False
    """Call `torch.compiler.reset()` after each evaluation, dropping every graph torch.compile holds
    (training's too: its next step recompiles). Evaluation itself runs the uncompiled module
    (`torch.compile`'s `_orig_mod`); use this when submodules compiled in place saw the eval shapes."""
    outcomes: bool = True
    """Keep each task's per-document outcomes (the values its figures are the means of) with every
    evaluation: a logger with a run directory writes them to `<run_dir>/outcomes/step_<N>.npz`, which
    `inloop-eval compare` pairs. false: keep none."""
    suite_average: list[SuiteAverageConfig] = field(default_factory=list)
    """Averages over named tasks, each centred on its chance level ((acc - chance) / (1 - chance), chance
    1 / choices per document), e.g. `suite_average: {label: core, tasks: [piqa, hellaswag, arc_easy]}` (one
    mapping or a list of them); each is logged as `eval/suite/<label>/centered_acc` with its `_stderr`, and its
    per-document values join the outcomes. None by default."""
    key_style: str = "inloop"
    """How metric keys are named: `inloop` (`eval/downstream/<label>/<metric>`), or `olmo_core`, where the OLMo
    figures of `olmo:<label>` tasks take the keys OLMo-core's downstream callback gives them
    (`eval/downstream/<label> (length-normalized accuracy)`, ...) so that a run moving from OLMo-core
    continues its curves; every other figure keeps its `inloop` key."""

    def __post_init__(self) -> None:
        check_fields(self, "")
        one_of(self.key_style, key_style_names(), "key_style")
        one_of(self.attention_mask, ("auto", *MASK_RENDERINGS), "attention_mask")
        # A label names keys `<prefix>/<kind>/<label>/...`: unique among the entries of one kind.
        for type_name, kind in KINDS.items():
            entries = [e for e in self.evaluators if isinstance(e, kind.config_class)]
            duplicated = repeated([label for e in entries for label in e.labels()])
            if duplicated:
                raise ConfigError(
                    f"{kind.config_class.labels_name} must be unique across `{type_name}` evaluators; "
                    f"repeated: {duplicated} (set `label:` to tell them apart)"
                )
        self.check_suites()

    def check_suites(self) -> None:
        """ConfigError naming the suite and the labels when a suite names a task the config does not
        evaluate, or two suites share a label."""
        duplicated = repeated([suite.label for suite in self.suite_average])
        if duplicated:
            raise ConfigError(f"suite_average labels must be unique; repeated: {duplicated}")
        # A config built in code may fill `evaluators` later; its suites are checked against what is there.
        if not self.evaluators:
            return
        known = [label for e in self.evaluators if isinstance(e, TaskEvalConfig) for label in e.labels()]
        for suite in self.suite_average:
            unknown = [task for task in suite.tasks if task not in known]
            if unknown:
                raise ConfigError(
                    f"suite_average {suite.label!r}: unknown task labels {unknown}; the config's downstream "
                    f"tasks are {known}"
                )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def agreed_settings(self) -> dict[str, Any]:
        """Every setting that changes what is scored or how it syncs, by its path (`evaluators[0].limit`), for
        the ranks to agree on (`distributed.agree_settings`); the data root and tokenizer paths may differ
        per node (the tasks' request fingerprints compare what they hold)."""
        data = {k: v for k, v in self.to_dict().items() if k not in ("data_root", "tokenizer")}
        return flat_settings(data)

    def batch_shape(self, needs: AdapterNeeds, device_type: str) -> BatchShape:
        """What every batch must be for a model whose adapter has `needs` on a device of `device_type`: the adapter's
        needs with this config's `pad_to_multiple`, `share_prefixes`, `keep_prefixes` and `attention_tokens`."""
        attention = attention_tokens_for(device_type, self.attention_tokens)
        return BatchShape.of(
            needs,
            self.pad_to_multiple,
            share_prefixes=self.share_prefixes,
            keep_prefixes=self.keep_prefixes,
            attention_tokens=attention,
        )

    def eval_context(
        self,
        adapter: ModelAdapter,
        dp_group: ProcessGroup | None,
        tokens: TokenCount,
        progress: Callable[[int], None] | None = None,
    ) -> EvalContext:
        """What one evaluation of a model through `adapter` hands every evaluator, as this config asks: the
        context length, the batch shape, `strict`, how masks are rendered and what runs a block rendering."""
        rendering = mask_rendering(adapter.device, self.attention_mask)
        return EvalContext(
            adapter,
            self.max_length or adapter.max_length,
            dp_group,
            self.batch_shape(adapter.needs, adapter.device.type),
            tokens,
            self.strict,
            progress,
            rendering,
            block_kernel(rendering, adapter.device, self.compile_attention),
        )

    def load_tokenizer(self) -> TokenizerLike:
        """The tokenizer `tokenizer:` names, looked up under the data root (`find_and_load_tokenizer`);
        ConfigError when the config names none."""
        if not self.tokenizer:
            raise ConfigError("evaluator: set `tokenizer:` in the config or pass tokenizer=")
        root = Path(self.data_root).expanduser() if self.data_root else default_data_root()
        return find_and_load_tokenizer(self.tokenizer, root)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> EvaluatorConfig:
        """The config of a mapping as YAML holds it; `where` names it in errors (e.g. the file)."""
        if isinstance(data, dict) and isinstance(data.get("suite_average"), dict):
            data = {**data, "suite_average": [data["suite_average"]]}  # one suite: a mapping alone
        config = build_dataclass(cls, data, where)
        if not config.evaluators:
            raise ConfigError(
                f"{where}: `evaluators` lists no evaluator; name at least one, e.g. "
                "`evaluators: [{task: piqa}]`"
            )
        return config

    @classmethod
    def from_yaml(cls, path: str | Path) -> EvaluatorConfig:
        """The config of a YAML file (`read_config_file`)."""
        return cls.from_dict(read_config_file(path), str(path))
