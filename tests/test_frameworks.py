"""A framework is one plugin (`inloop_eval.frameworks.Framework`): no module outside its integration package
names it, the built-in table's import paths resolve, and a framework written here (a toy) is consulted like a
built-in one by the engine (its adapter), the watcher (its checkpoints, found, loaded and evaluated) and the
keys (its key style) once it is registered, and by none of them once it is not."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
import torch
from test_imports import PACKAGE, modules

from inloop_eval.checkpoints.formats import Checkpoint, CheckpointFormat, checkpoint_formats
from inloop_eval.data.root import neox_tokenizer_path
from inloop_eval.engine.adapters.hidden_states import HiddenStatesAdapter
from inloop_eval.engine.families import make_adapter
from inloop_eval.errors import ConfigError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.frameworks import Framework, frameworks, register_framework, resolve, unregister_framework
from inloop_eval.integrations.plugins import BUILT_IN
from inloop_eval.keys import DOWNSTREAM, KeyStyle, key_style_names
from inloop_eval.models.gpt import GPT, GPTConfig
from inloop_eval.watch import WatchConfig, Watcher
from inloop_eval.watch.discovery import discover

# The one module outside the framework packages that names them: the table of built-in plugins.
TABLE = "inloop_eval.integrations.plugins"


def framework_words() -> re.Pattern[str]:
    """Each built-in framework's name and package, `_` matching `-`, ` ` or nothing (OLMo-core, olmo_core)."""
    words = {w for plugin in BUILT_IN for w in (plugin.name, plugin.package)}
    return re.compile("|".join(re.escape(w).replace("_", "[-_ ]?") for w in sorted(words)), re.IGNORECASE)


def docstring_starts(tree: ast.AST) -> set[tuple[int, int]]:
    """Where each string that is a statement of its own starts: docstrings (and attribute docstrings)."""
    return {
        (node.lineno, node.col_offset)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def framework_mentions(source: str, words: re.Pattern[str]) -> list[tuple[int, str]]:
    """(line, token) of every name or string in `source` naming a framework; docstrings and comments aside."""
    docs = docstring_starts(ast.parse(source))
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        named = token.type == tokenize.NAME or (token.type == tokenize.STRING and token.start not in docs)
        if named and words.search(token.string):
            found.append((token.start[0], token.string))
    return found


def outside_framework_packages(module: str) -> bool:
    parts = module.split(".")
    in_package = len(parts) >= 3 and parts[1] == "integrations" and parts[2] in {p.name for p in BUILT_IN_PACKAGES}
    return not in_package and module != TABLE


BUILT_IN_PACKAGES = [p for p in (PACKAGE / "integrations").iterdir() if (p / "plugin.py").is_file()]


def test_the_check_finds_a_framework_named_in_code_but_not_in_a_docstring():
    source = '"""Runs OLMo-core models."""\nimport olmo_core\nKIND = "torchtitan"\n# megatron, a comment\n'
    assert framework_mentions(source, framework_words()) == [(2, "olmo_core"), (3, '"torchtitan"')]


def test_no_module_outside_a_framework_package_names_a_framework():
    words = framework_words()
    found = [
        f"{module}:{line} {token[:80]}"
        for module, path in modules().items()
        if outside_framework_packages(module)
        for line, token in framework_mentions(path.read_text(), words)
    ]
    assert found == []


def test_every_framework_package_declares_one_plugin_and_the_table_lists_them_all():
    declared = [resolve(f"inloop_eval.integrations.{p.name}.plugin:FRAMEWORK") for p in BUILT_IN_PACKAGES]
    assert sorted(declared, key=lambda p: p.name) == sorted(BUILT_IN, key=lambda p: p.name)
    assert len({p.name for p in BUILT_IN}) == len(BUILT_IN)


@pytest.mark.parametrize("plugin", BUILT_IN, ids=lambda p: p.name)
def test_each_built_in_plugins_import_paths_resolve(plugin):
    """The paths are strings, so nothing else checks them before a model or checkpoint of the framework comes."""
    pytest.importorskip(plugin.package)
    for path in [plugin.adapter, plugin.checkpoint, plugin.key_style, plugin.attention, *plugin.trainer_hooks]:
        if path is not None:
            assert resolve(path) is not None, path
    if plugin.model_class:
        assert isinstance(resolve(plugin.model_class), type)
    if plugin.checkpoint:
        assert isinstance(plugin.checkpoint_format(), CheckpointFormat)
    if plugin.key_style:
        assert plugin.style().name == plugin.name


def test_a_plugin_is_checked_when_declared():
    with pytest.raises(ConfigError, match="is not an import path"):
        Framework(name="toy", title="Toy", package="toy", checkpoint="toy.checkpoint")
    with pytest.raises(ConfigError, match="model_class and adapter go together"):
        Framework(name="toy", title="Toy", package="toy", model_class="toy:Model")
    with pytest.raises(ConfigError, match="lowercase identifier"):
        Framework(name="Toy Trainer", title="Toy", package="toy")


# The toy framework: its model (the reference GPT under another class), saved as `toy-<N>/weights.pt` with
# `done` written last, and a key style naming every downstream figure `<prefix>/toy/<task>/<figure>`.
class ToyModel(GPT):
    """A model of the toy framework."""


def toy_adapter(model: ToyModel, max_length: int | None) -> HiddenStatesAdapter:
    adapter = HiddenStatesAdapter(model)
    adapter.built_by_toy = True
    return adapter


TOY_SHAPE = GPTConfig(vocab_size=50304, d_model=16, n_layers=1, n_heads=2, max_seq_len=256)


@dataclass(frozen=True)
class ToyCheckpoints(CheckpointFormat):
    def missing(self, path: Path, *, needs_config: bool) -> str | None:
        return None if (path / "done").is_file() else "no done yet"

    def load(self, checkpoint: Checkpoint, model_builder: str | None) -> torch.nn.Module:
        model = ToyModel(TOY_SHAPE)
        model.load_state_dict(torch.load(checkpoint.path / "weights.pt", weights_only=True))
        return model


TOY_FORMAT = ToyCheckpoints(name="toy", title="Toy", folder=re.compile(r"toy-(\d+)"), folder_example="toy-<N>")


class ToyKeys(KeyStyle):
    name = "toy"

    def key(self, kind: str, source: str, figure: str, prefix: str) -> str | None:
        return f"{prefix}/toy/{source}/{figure}" if kind == DOWNSTREAM else None


TOY_KEYS = ToyKeys()
TOY = Framework(
    name="toy",
    title="Toy",
    package="torch",
    model_class=f"{__name__}:ToyModel",
    adapter=f"{__name__}:toy_adapter",
    checkpoint=f"{__name__}:TOY_FORMAT",
    key_style=f"{__name__}:TOY_KEYS",
)


@pytest.fixture
def toy():
    register_framework(TOY)
    try:
        yield TOY
    finally:
        unregister_framework(TOY.name)


def save_toy_checkpoints(folder: Path, steps: list[int]) -> None:
    for step in steps:
        torch.manual_seed(step)
        path = folder / f"toy-{step}"
        path.mkdir(parents=True)
        torch.save(ToyModel(TOY_SHAPE).state_dict(), path / "weights.pt")
        (path / "done").write_text("")


def test_a_registered_framework_is_consulted_first_and_forgotten_when_unregistered(toy):
    assert frameworks()[0] is toy and "toy" in checkpoint_formats() and "toy" in key_style_names()
    assert getattr(make_adapter(ToyModel(TOY_SHAPE)), "built_by_toy", False)
    unregister_framework("toy")
    assert "toy" not in checkpoint_formats() and "toy" not in key_style_names()
    assert not getattr(make_adapter(ToyModel(TOY_SHAPE)), "built_by_toy", False)
    with pytest.raises(ConfigError, match="key_style"):
        EvaluatorConfig.from_dict({"evaluators": [{"task": "piqa"}], "key_style": "toy"})


def test_the_watcher_finds_loads_and_evaluates_a_registered_frameworks_checkpoints(toy, data_root, tmp_path):
    folder = tmp_path / "checkpoints"
    save_toy_checkpoints(folder, [3, 7])
    (folder / "toy-9-tmp").mkdir()  # a name of no format: not a checkpoint
    assert [(c.step, c.format) for c in discover(folder)] == [(3, "toy"), (7, "toy")]
    evaluator_config = EvaluatorConfig.from_dict(
        {
            "evaluators": [{"task": "piqa", "limit": 4}],
            "tokenizer": str(neox_tokenizer_path(data_root)),
            "data_root": str(data_root),
            "key_style": "toy",
        }
    )
    config = WatchConfig(checkpoint_dir=str(folder), run_dir=str(tmp_path / "run"), once=True, settle_s=0)
    watcher = Watcher(config, evaluator_config)
    assert watcher.run() == [3, 7]
    lines = [line for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if "toy/piqa" in line]
    assert len(lines) == 2 and '"eval/toy/piqa/acc"' in lines[0]


def test_the_design_page_names_every_part_of_a_plugin():
    """docs/design.md's "Adding a framework" names every field of `Framework`, every field and method of
    `CheckpointFormat` and `KeyStyle`, and the tests that hold a plugin to them."""
    design = (PACKAGE.parent / "docs" / "design.md").read_text()
    section = design.split("### Adding a framework", 1)[1].split("\n### ", 1)[0]
    names = [f.name for f in fields(Framework)] + [f.name for f in fields(CheckpointFormat)]
    names += [m for m in vars(CheckpointFormat) if not m.startswith("_") and callable(getattr(CheckpointFormat, m))]
    names += [m for m in vars(KeyStyle) if not m.startswith("_") and callable(getattr(KeyStyle, m))]
    missing = [name for name in names if f"`{name}" not in section]
    assert missing == [] and "tests/test_frameworks.py" in section
    assert "tests/integrations/test_framework_conformance.py" in section and "`CASES`" in section
