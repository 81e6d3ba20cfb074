"""What a training framework brings, declared once per framework: the `Framework` interface and the registry the
engine, the evaluators and the watcher consult, so that none of them names a framework.

A framework's plugin is one `Framework` value in its package (`inloop_eval/integrations/<name>/plugin.py`),
listed in the table of built-in plugins (`inloop_eval/integrations/plugins.py`, registered when the package is
imported) or added by `register_framework`. Each part it declares is an import path, `module:attribute`,
imported only when that part is first used (for a model of the framework's class, a checkpoint in its format,
its key style): so declaring a plugin imports nothing of its framework, and a run that never meets a
framework never imports it. The parts, each optional:

- `model_class`: the framework's model class, `module:Class`, looked up in `sys.modules` and never imported
  (a model can be one only if its framework is loaded); `adapter`: the builder of its `ModelAdapter`,
  `(model, max_length) -> ModelAdapter`. `engine/families.py` tries the frameworks' families after those a
  user registered and before the framework-neutral ones.
- `attention`: how its attention and positions are routed through the engine's attention during an
  evaluation: the `AttentionRoute` (`engine/attention_route.py`) its adapter applies, which modules' forwards
  are swapped and what is refused (transformers' models route through its own attention-function registry
  instead, `integrations/hf/attention.py`).
- `checkpoint`: its `CheckpointFormat` (`inloop_eval.checkpoints.formats`): how the watcher finds, checks and
  loads its checkpoints, whole or sharded (`integrations/<name>/checkpoint.py`).
- `key_style`: its `KeyStyle` (`inloop_eval.keys`), chosen by `key_style: <name>`, so that a run moving from
  the framework's own evaluator keeps its curves.
- `trainer_hooks`: the hooks a training loop of the framework adds (callbacks, a validator), named for the
  docs and `inloop-eval` messages.

Registered frameworks are tried in order: a user's (the latest first), then the built-in table's.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any

from inloop_eval.errors import ConfigError


def resolve(path: str) -> Any:
    """The attribute an import path `module:attribute` (attribute dotted or not) names, its module imported."""
    module, _, attribute = path.partition(":")
    target: Any = importlib.import_module(module)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


def loaded_class(path: str) -> type | None:
    """The class `module:Class` names when its module is loaded already (never imported); else None."""
    module, _, name = path.partition(":")
    cls = getattr(sys.modules.get(module), name, None)
    return cls if isinstance(cls, type) else None


@dataclass(frozen=True)
class Framework:
    """One training framework's plugin (see the module docstring for each part).

    name: its identifier (`key_style: <name>` picks its key style; lowercase, no spaces).
    title: how messages and docs name it.
    package: the top-level module it is imported as (`pip` hints and the import checks).
    extra: the extra that installs it, `pip install 'inloop_eval[<extra>]'`; '' for none.
    model_class, adapter, attention, checkpoint, key_style: import paths `module:attribute`, or None.
    through_call: its adapter calls the model through `__call__`; False for one that reaches past it (a head
        applied apart), which an FSDP2 module is then called through the logits adapter instead.
    saved_models: its checkpoint format loads a saved model folder as it is (`inloop-eval evaluate --model`).
    trainer_hooks: import paths of its training-loop hooks.
    """

    name: str
    title: str
    package: str
    extra: str = ""
    model_class: str | None = None
    adapter: str | None = None
    through_call: bool = True
    attention: str | None = None
    checkpoint: str | None = None
    key_style: str | None = None
    saved_models: bool = False
    trainer_hooks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or not self.name.isidentifier() or self.name != self.name.lower():
            raise ConfigError(f"Framework: name {self.name!r} is not a lowercase identifier (e.g. 'my_trainer')")
        paths = [self.model_class, self.adapter, self.attention, self.checkpoint, self.key_style]
        for path in [*paths, *self.trainer_hooks]:
            if path is not None and (":" not in path or not all(path.partition(":")[::2])):
                raise ConfigError(f"Framework {self.name!r}: {path!r} is not an import path `module:attribute`")
        if (self.model_class is None) != (self.adapter is None):
            raise ConfigError(
                f"Framework {self.name!r}: model_class and adapter go together (found model_class "
                f"{self.model_class!r}, adapter {self.adapter!r})"
            )

    def matches(self, model: Any) -> bool:
        """Whether `model` is of the framework's model class (False when the framework is not loaded)."""
        cls = loaded_class(self.model_class) if self.model_class else None
        return cls is not None and isinstance(model, cls)

    def build_adapter(self, model: Any, max_length: int | None) -> Any:
        """The framework's `ModelAdapter` for `model`."""
        if self.adapter is None:
            raise ConfigError(f"Framework {self.name!r} declares no adapter")
        return resolve(self.adapter)(model, max_length)

    def checkpoint_format(self) -> Any:
        """Its `CheckpointFormat`, or None."""
        return resolve(self.checkpoint) if self.checkpoint else None

    def style(self) -> Any:
        """Its `KeyStyle`, or None."""
        return resolve(self.key_style) if self.key_style else None


_built_in: list[Framework] = []
_registered: list[Framework] = []


def register_framework(framework: Framework) -> None:
    """Consult `framework` before every built-in one and every one registered before it; one of the same name
    is replaced."""
    _registered[:] = [f for f in _registered if f.name != framework.name]
    _registered.insert(0, framework)


def unregister_framework(name: str) -> None:
    """Remove the registered framework `name` (a no-op when there is none; built-in ones stay)."""
    _registered[:] = [f for f in _registered if f.name != name]


def register_built_in(table: tuple[Framework, ...]) -> None:
    """Set the built-in plugins, in the order they are tried (the package does it once, on import)."""
    _built_in[:] = table


def frameworks() -> tuple[Framework, ...]:
    """Every framework, in the order they are consulted: registered ones (the latest first), then built-in."""
    names = {f.name for f in _registered}
    return (*_registered, *(f for f in _built_in if f.name not in names))


def framework(name: str) -> Framework:
    """The framework called `name`; ConfigError naming the known ones otherwise."""
    for found in frameworks():
        if found.name == name:
            return found
    raise ConfigError(f"no framework {name!r}; expected one of {sorted(f.name for f in frameworks())}")
