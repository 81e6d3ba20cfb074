"""The checks every config dataclass runs: keyword-only dataclasses, loaded from YAML files in `configs/`.

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
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import yaml

from inloop_eval.errors import ConfigError

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


def closest_keys(unknown: list[Any], names: list[str]) -> str:
    """`; did you mean ...?` with the known key closest to each unknown one that has a close one (difflib),
    '' when none has."""
    guesses = {}
    for key in unknown:
        close = difflib.get_close_matches(str(key), names, n=1) if isinstance(key, str) else []
        if close:
            guesses[key] = close[0]
    if not guesses:
        return ""
    if len(unknown) == 1:
        return f"; did you mean {next(iter(guesses.values()))!r}?"
    return "; did you mean " + ", ".join(f"{close!r} for {key!r}" for key, close in guesses.items()) + "?"


def build_dataclass(cls: type, data: Any, where: str) -> Any:
    """`cls(**data)` for a keyword-only config dataclass: every value checked against its field's
    annotation first (`check_value`), errors naming `where` and the key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, found {shown(data)}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names), key=str)
    if unknown:
        raise ConfigError(
            f"{where}: unknown keys {unknown} for {cls.__name__}{closest_keys(unknown, names)}; "
            f"known keys: {sorted(names)}"
        )
    annotations = field_annotations(cls)
    values = {key: check_value(value, annotations[key], located(where, key)) for key, value in data.items()}
    try:
        return cls(**values)
    except TypeError as exc:  # a required key left out
        raise ConfigError(f"{where}: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(located(where, str(exc))) from None
