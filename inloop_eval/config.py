"""Evaluator configuration: keyword-only dataclasses, loaded from YAML files in `configs/`.

Every field is checked against its annotation when a config is built, from YAML, a dict or keywords
(`check_fields`, `check_value`): `int` takes integers only (not booleans, not 2.5), `bool` takes true or false
only (not the string "false"), `str` strings, `float` numbers, `X | None` also null, `list[X]` lists (a lone
string is a list of one string), and a field annotated with config dataclasses takes mappings, built into
them (by their `type:` when there are several). A lower bound is part of the annotation:
`Annotated[int, AtLeast(1)]`.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import yaml

from inloop_eval.errors import ConfigError
from inloop_eval.metrics.registry import ALL_METRICS, unknown_metrics

EVALUATOR_TYPES = ("downstream",)
KEY_STYLES = ("inloop", "olmo_core")
YAML_BOOLEAN_WORDS = ("true", "false", "yes", "no", "on", "off", "y", "n")


@dataclass(frozen=True)
class AtLeast:
    """Lower bound of an integer config field, declared in its annotation: `Annotated[int, AtLeast(1)]`."""

    minimum: int


def repeated(labels: list[str]) -> list[str]:
    """The labels that occur more than once, sorted."""
    return sorted({x for x in labels if labels.count(x) > 1})


def located(where: str, what: str) -> str:
    """`where: what`, or `what` alone when there is no location."""
    return f"{where}: {what}" if where else what


def shown(value: Any, limit: int = 60) -> str:
    """A config value as the YAML user wrote it, for an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_of(value: Any, choices: typing.Sequence[str], key: str) -> None:
    """ConfigError unless `value` is one of `choices` (matched case-sensitively; a near miss is named)."""
    if isinstance(value, str) and value in choices:
        return
    message = f"{key} must be one of {list(choices)}, found {shown(value)}"
    if isinstance(value, str):
        same = [c for c in choices if c.lower() == value.lower()]
        close = same or difflib.get_close_matches(value, choices, n=1)
        if close:
            message += f"; did you mean {close[0]!r}?" + (" (names are case-sensitive)" if same else "")
    raise ConfigError(message)


def check_label(label: str, where: str) -> None:
    """A label chosen by the user names metric keys and, for `lm` domains, folders: non-empty, lower-case,
    without spaces or '/', and without '..'."""
    if not label:
        raise ConfigError(f"{where}: `label` is required, e.g. `label: code`")
    if label != label.lower() or " " in label or "/" in label or ".." in label:
        raise ConfigError(
            f"{where}: label {label!r} must be lower-case without spaces or '/', and not contain '..' "
            f"(e.g. {re.sub(r'[^a-z0-9_]+', '_', label.lower()).strip('_') or 'code'!r})"
        )


@cache
def field_annotations(cls: type) -> dict[str, Any]:
    """The resolved annotation of each field of the dataclass `cls`, `Annotated` bounds kept."""
    return typing.get_type_hints(cls, include_extras=True)


def _split_optional(annotation: Any) -> tuple[list[Any], bool]:
    """(the alternatives of `annotation` other than None, whether None is allowed)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = list(typing.get_args(annotation))
        return [o for o in options if o is not type(None)], type(None) in options
    return [annotation], False


def _unannotated(annotation: Any) -> tuple[Any, list[AtLeast]]:
    """(the type inside `Annotated[...]`, its bounds)."""
    if typing.get_origin(annotation) is Annotated:
        base, *extras = typing.get_args(annotation)
        return base, [e for e in extras if isinstance(e, AtLeast)]
    return annotation, []


def describe(annotation: Any, plural: bool = False) -> str:
    """What a field of this annotation takes, in the YAML user's words: 'an integer >= 1 or null'."""
    options, nullable = _split_optional(annotation)
    if all(dataclasses.is_dataclass(o) for o in options):
        text = "mappings" if plural else "a mapping"
    else:
        base, bounds = _unannotated(options[0])
        if typing.get_origin(base) is list:
            text = (
                ("lists" if plural else "a list") + " of " + describe(typing.get_args(base)[0], plural=True)
            )
        else:
            words = {
                bool: ("true or false", "true or false"),
                int: ("an integer", "integers"),
                float: ("a number", "numbers"),
                str: ("a string", "strings"),
            }
            text = words.get(base, (base.__name__, base.__name__))[plural]
            text += "".join(f" >= {b.minimum}" for b in bounds)
    return f"{text} or null" if nullable else text


def _fits(value: Any, base: Any) -> bool:
    """Whether a scalar `value` has the type `base`; booleans are not numbers."""
    if base is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if base is float:
        return isinstance(value, (int, float))
    return isinstance(value, base)


def _mismatch_hint(value: Any, base: Any) -> str:
    """Why a value that looks right is refused, and what to write instead."""
    if isinstance(value, str):
        text = value.strip()
        if base is bool and text.lower() in YAML_BOOLEAN_WORDS:
            return "; a quoted string is not a boolean: write true or false without quotes"
        if base in (int, float):
            try:
                number = float(text)
            except ValueError:
                return ""
            if base is int and not number.is_integer():
                return ""
            written = str(int(number)) if base is int else repr(number)
            return f"; YAML reads {text} as a string: write {written}, without quotes"
    if isinstance(value, bool) and base in (int, float):
        return "; true and false are not numbers"
    if isinstance(value, float) and base is int and value.is_integer():
        return f"; write {int(value)}"
    return ""


def _entry_name(value: Any) -> str:
    """` (label)` of a nested config mapping, to name it in errors beside its index."""
    if isinstance(value, dict):
        for key in ("label", "task"):
            if isinstance(value.get(key), str) and value[key]:
                return f" ({value[key]})"
    return ""


def _config_class(classes: list[type], data: dict[str, Any], key: str) -> type:
    """The class of `classes` that a nested mapping builds: by its `type:`, else the first class."""
    if len(classes) == 1:
        return classes[0]
    kinds = {f.default: c for c in classes for f in dataclasses.fields(c) if f.name == "type"}
    kind = data.get("type", next(iter(kinds)))
    one_of(kind, list(kinds), located(key, "type"))
    return kinds[kind]


def check_value(value: Any, annotation: Any, key: str) -> Any:
    """`value` checked against the field annotation `annotation`, nested config mappings built into their
    dataclasses; ConfigError naming `key` (the location and field, e.g. `evaluators[2] (piqa): limit`)."""
    options, nullable = _split_optional(annotation)
    if value is None and nullable:
        return None
    if all(dataclasses.is_dataclass(o) for o in options):
        if isinstance(value, tuple(options)):
            return value
        if not isinstance(value, dict):
            raise _mismatch(key, annotation, value)
        return build_dataclass(_config_class(options, value, key), value, key)
    if len(options) != 1:
        raise TypeError(f"config field {key}: annotation {annotation} is not one the checker knows")
    base, bounds = _unannotated(options[0])
    if typing.get_origin(base) is list:
        if base == list[str] and isinstance(value, str):
            value = [value]  # YAML `paths: a.npy` means a list of one
        if not isinstance(value, list):
            raise _mismatch(key, annotation, value)
        (item,) = typing.get_args(base)
        return [check_value(v, item, f"{key}[{i}]{_entry_name(v)}") for i, v in enumerate(value)]
    if not _fits(value, base):
        raise _mismatch(key, annotation, value, _mismatch_hint(value, base))
    if any(value < b.minimum for b in bounds):
        raise _mismatch(key, annotation, value)
    return value


def _mismatch(key: str, annotation: Any, value: Any, hint: str = "") -> ConfigError:
    """`<key> must be <what the annotation takes>, found <value><hint>`."""
    return ConfigError(f"{key} must be {describe(annotation)}, found {shown(value)}{hint}")


def check_fields(config: Any, where: str) -> None:
    """Check every field of the config dataclass `config` against its annotation (see `check_value`),
    replacing nested config mappings by the dataclasses they build."""
    annotations = field_annotations(type(config))
    for f in dataclasses.fields(config):
        value = check_value(getattr(config, f.name), annotations[f.name], located(where, f.name))
        setattr(config, f.name, value)


@dataclass(kw_only=True)
class TaskEvalConfig:
    """One evaluator of the list: a downstream task and how to batch it."""

    task: str
    """Task id from the registry (`inloop-eval tasks` lists them)."""
    label: str = ""
    """Name in metric keys (`eval/downstream/<label>/<metric>`): lower-case, without spaces, '/' or '..'.
    Defaults to the task id, which is then only required to be lower-case without spaces (so
    `harness:my_tasks/science.yaml` keeps its slash); set a label to get keys without colons or slashes."""
    type: str = "downstream"
    """Evaluator type: `downstream` (multiple-choice by loglikelihood)."""
    batch_tokens: Annotated[int, AtLeast(1)] = 8192
    """Token budget of one forward pass (rows x longest row, padding included)."""
    limit: Annotated[int, AtLeast(1)] | None = None
    """Evaluate only the first `limit` documents of the split."""
    metrics: list[str] | None = None
    """Figures to report instead of the task's defaults (names from `inloop_eval.metrics.registry.ALL_METRICS`)."""
    subset_num_batches: Annotated[int, AtLeast(1)] | None = None
    """Evaluate only the leading documents that fit in this many batches of `batch_tokens` (whole
    documents, in order, at least one), for cheap frequent evals. The budget is for the whole task, not
    per rank, so every world size scores the same documents; the documents left out are counted in
    `n_skipped_docs`. null: every document (up to `limit`)."""

    def __post_init__(self) -> None:
        check_fields(self, f"evaluator {shown(self.label or self.task)}")
        if not self.task:
            raise ConfigError("evaluator: `task` is required, e.g. `task: piqa`")
        if self.label and self.label != self.task:
            check_label(self.label, f"evaluator {self.task!r}")
        self.label = self.label or self.task
        if self.label != self.label.lower() or " " in self.label:
            raise ConfigError(
                f"evaluator {self.task!r}: label {self.label!r} must be lower-case without spaces "
                "(set `label:` when the task id is not)"
            )
        one_of(self.type, EVALUATOR_TYPES, f"evaluator {self.label!r}: type")
        if self.metrics is not None:
            unknown = unknown_metrics(self.metrics)
            if unknown:
                raise ConfigError(
                    f"evaluator {self.label!r}: unknown metrics {unknown}; choose from {list(ALL_METRICS)}"
                )


LM_FORMATS = ("memmap", "jsonl", "text")
LM_DTYPES = ("uint16", "uint32")


def check_lm_label(label: str, where: str) -> None:
    """Domain labels go into keys `eval/lm/<label>/<figure>` and name folders (`make-lm`): non-empty,
    lower-case, no spaces, '/' or '..'."""
    check_label(label, where)


@dataclass(kw_only=True)
class LMDomainConfig:
    """One domain of an `lm` evaluator: a label and the files holding its held-out text or tokens."""

    label: str
    """Name in metric keys (`eval/lm/<label>/<ce|ppl|bpb>`), e.g. `code`, `books`."""
    paths: list[str]
    """Files or glob patterns (`**` recurses, `~` expands), e.g. `[~/lm/code/*.npy]`; a single string is
    taken as a one-element list."""
    format: str = "memmap"
    """`memmap`: raw token ids (OLMo's `.npy` files), read as sequences of `seq_len`; `jsonl`: one document
    per line in the field `text_field` (`.gz` allowed); `text`: each file is one document."""
    dtype: str = "uint16"
    """Token type of raw `memmap` files (`uint16` or `uint32`); files written by `np.save` carry their own."""
    text_field: str = "text"
    """Field of each JSONL line holding the document (`format: jsonl`)."""
    max_tokens: Annotated[int, AtLeast(1)] | None = None
    """Cap on the predicted tokens of this domain; overrides the evaluator's `max_tokens`."""

    def __post_init__(self) -> None:
        check_fields(self, f"lm domain {shown(self.label)}")
        check_lm_label(self.label, "lm domain")
        if not self.paths or not all(self.paths):
            raise ConfigError(
                f"lm domain {self.label!r}: `paths` must list files or globs, e.g. [data/code/*.npy], "
                f"found {self.paths!r}"
            )
        one_of(self.format, LM_FORMATS, f"lm domain {self.label!r}: format")
        one_of(self.dtype, LM_DTYPES, f"lm domain {self.label!r}: dtype")
        if not self.text_field:
            raise ConfigError(f"lm domain {self.label!r}: text_field must not be empty")


@dataclass(kw_only=True)
class LMEvalConfig:
    """An evaluator of type `lm`: perplexity per domain label on held-out data (`eval/lm/<label>/...`)."""

    type: str = "lm"
    """Evaluator type; always `lm` for this class."""
    domains: list[LMDomainConfig] = field(default_factory=list)
    """The domain sets, each with its label; reported in this order."""
    seq_len: Annotated[int, AtLeast(2)] = 1024
    """Tokens per sequence: memmap files are cut into sequences of this length; text documents into
    windows of at most this length. A sequence of L tokens predicts L - 1 of them."""
    batch_tokens: Annotated[int, AtLeast(1)] = 8192
    """Token budget of one forward pass (rows x longest row); at least `seq_len`."""
    max_tokens: Annotated[int, AtLeast(1)] | None = None
    """Cap on the predicted tokens of each domain (whole sequences, a fixed seeded choice); null: all."""
    cache_dir: str | None = None
    """Where tokenized text domains are cached; default `<home>/lm_cache` (`$INLOOP_EVAL_HOME`)."""

    def __post_init__(self) -> None:
        if self.type != "lm":
            raise ConfigError(f"lm evaluator: type must be 'lm', found {shown(self.type)}")
        check_fields(self, "lm evaluator")
        if not self.domains:
            raise ConfigError(
                "lm evaluator: `domains` must list at least one domain, e.g. "
                "[{label: code, paths: [data/code/*.npy]}]"
            )
        labels = [d.label for d in self.domains]
        duplicated = repeated(labels)
        if duplicated:
            raise ConfigError(f"lm evaluator: domain labels must be unique; repeated: {duplicated}")
        if self.batch_tokens < self.seq_len:
            raise ConfigError(
                f"lm evaluator: batch_tokens ({self.batch_tokens}) must be >= seq_len ({self.seq_len}) so "
                "that a whole sequence fits in one forward pass"
            )
        for d in self.domains:
            cap = self.cap(d)
            if cap is not None and cap < self.seq_len - 1:
                raise ConfigError(
                    f"lm domain {d.label!r}: max_tokens ({cap}) must be >= seq_len - 1 ({self.seq_len - 1}), "
                    "the tokens one sequence predicts"
                )

    def cap(self, domain: LMDomainConfig) -> int | None:
        """The token cap that applies to `domain`: its own, else the evaluator's."""
        return domain.max_tokens if domain.max_tokens is not None else self.max_tokens


@dataclass(kw_only=True)
class EvaluatorConfig:
    """Everything `InLoopEvaluator` needs; logged whole with each run."""

    evaluators: list[TaskEvalConfig | LMEvalConfig] = field(default_factory=list)
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
    """Re-raise a task's failure instead of reporting `eval/downstream/<task>/failed = 1`."""
    pad_to_multiple: Annotated[int, AtLeast(1)] = 1
    """Round every batch's width up to a multiple of this many tokens (bucketed shapes, so a model whose
    forward is compiled sees a few widths rather than one per batch); 1 is off. An adapter passed to `run`
    keeps its own setting unless this is set."""
    compiler_reset: bool = False
    """Call `torch.compiler.reset()` after each evaluation, dropping every graph torch.compile holds
    (training's too: its next step recompiles). Evaluation itself runs the uncompiled module
    (`torch.compile`'s `_orig_mod`); use this when submodules compiled in place saw the eval shapes."""
    key_style: str = "inloop"
    """How metric keys are named: `inloop` (`eval/downstream/<label>/<metric>`), or `olmo_core`, where the OLMo
    figures of `olmo:<label>` tasks take the keys OLMo-core's downstream callback gives them
    (`eval/downstream/<label> (length-normalized accuracy)`, ...) so that a run moving from OLMo-core
    continues its curves; every other figure keeps its `inloop` key."""

    def __post_init__(self) -> None:
        check_fields(self, "")
        one_of(self.key_style, KEY_STYLES, "key_style")
        labels = [e.label for e in self.evaluators if isinstance(e, TaskEvalConfig)]
        duplicated = repeated(labels)
        if duplicated:
            raise ConfigError(
                f"evaluator labels must be unique; repeated: {duplicated} (set `label:` to tell them apart)"
            )
        lm_labels = [d.label for e in self.evaluators if isinstance(e, LMEvalConfig) for d in e.domains]
        duplicated = repeated(lm_labels)
        if duplicated:
            raise ConfigError(
                f"lm domain labels must be unique across `lm` evaluators; repeated: {duplicated}"
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


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The evaluator settings of the YAML file `path`, as a mapping: its `evaluation:` section if it has one
    (a demo config), else its top level. ConfigError for a missing, unreadable or invalid file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(
            f"config file {path} is a directory; name a YAML file, e.g. {path / 'config.yaml'}"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: cannot be read ({exc}); expected a UTF-8 YAML file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping at the top, found {type(data).__name__}")
    return data.get("evaluation", data)


def build_dataclass(cls: type, data: Any, where: str) -> Any:
    """`cls(**data)` for a keyword-only config dataclass: every value checked against its field's
    annotation first (`check_value`), errors naming `where` and the key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, found {shown(data)}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names), key=str)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown} for {cls.__name__}; known keys: {sorted(names)}")
    annotations = field_annotations(cls)
    values = {key: check_value(value, annotations[key], located(where, key)) for key, value in data.items()}
    try:
        return cls(**values)
    except TypeError as exc:  # a required key left out
        raise ConfigError(f"{where}: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(located(where, str(exc))) from None
