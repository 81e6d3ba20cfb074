"""The whole evaluator config: the list of evaluators (each kind's own config class, `kinds.EntryConfig`) and
the settings they share; logged whole with each run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from inloop_eval.config_fields import (
    AtLeast,
    build_dataclass,
    check_fields,
    one_of,
    read_config_file,
    repeated,
)
from inloop_eval.errors import ConfigError
from inloop_eval.evaluators.kinds import KINDS, EntryConfig
from inloop_eval.keys import KEY_STYLES


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
    """Path of a `tokenizers` JSON file or a Hugging Face tokenizer directory (unless one is passed in)."""
    data_root: str | None = None
    """Local task data in OLMo's layout; default `$INLOOP_EVAL_DATA` or `~/.cache/inloop_eval/data`."""
    max_length: Annotated[int, AtLeast(2)] | None = None
    """Longest input in tokens; default: the model's own (position embeddings), else 2048."""
    strict: bool = False
    """Re-raise an evaluator's failure instead of reporting `failed = 1` under its labels
    (`eval/downstream/<label>/failed`, `eval/lm/<label>/failed`)."""
    pad_to_multiple: Annotated[int, AtLeast(1)] = 1
    """Round every batch's width up to a multiple of this many tokens (bucketed shapes, so a model whose
    forward is compiled sees a few widths rather than one per batch); 1 is off. An adapter passed to `run`
    keeps its own setting unless this is set."""
    compiler_reset: bool = False
    """Call `torch.compiler.reset()` after each evaluation, dropping every graph torch.compile holds
    (training's too: its next step recompiles). Evaluation itself runs the uncompiled module
    (`torch.compile`'s `_orig_mod`); use this when submodules compiled in place saw the eval shapes."""
    outcomes: bool = True
    """Keep each task's per-document outcomes (the values its figures are the means of) with every
    evaluation: a logger with a run directory writes them to `<run_dir>/outcomes/step_<N>.npz`, which
    `inloop-eval compare` pairs. false: keep none."""
    key_style: str = "inloop"
    """How metric keys are named: `inloop` (`eval/downstream/<label>/<metric>`), or `olmo_core`, where the OLMo
    figures of `olmo:<label>` tasks take the keys OLMo-core's downstream callback gives them
    (`eval/downstream/<label> (length-normalized accuracy)`, ...) so that a run moving from OLMo-core
    continues its curves; every other figure keeps its `inloop` key."""

    def __post_init__(self) -> None:
        check_fields(self, "")
        one_of(self.key_style, KEY_STYLES, "key_style")
        # A label names keys `<prefix>/<kind>/<label>/...`: unique among the entries of one kind.
        for type_name, kind in KINDS.items():
            entries = [e for e in self.evaluators if isinstance(e, kind.config_class)]
            duplicated = repeated([label for e in entries for label in e.labels()])
            if duplicated:
                raise ConfigError(
                    f"{kind.config_class.labels_name} must be unique across `{type_name}` evaluators; "
                    f"repeated: {duplicated} (set `label:` to tell them apart)"
                )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> EvaluatorConfig:
        """The config of a mapping as YAML holds it; `where` names it in errors (e.g. the file)."""
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
