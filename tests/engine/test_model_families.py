"""The engine knows no framework: no engine module imports one, every adapter lives in the engine (the
framework-neutral ones) or in its framework's integration package, and the model families take each
framework's adapter from its plugin, imported only for a model of that framework."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import OrderedDict

from test_imports import PACKAGE, imported_names, modules

from inloop_eval.engine.families import ModelFamily, families, make_adapter
from inloop_eval.frameworks import Framework, loaded_class

FRAMEWORKS = ("olmo_core", "torchtitan", "megatron", "transformers", "lightning")


def test_no_engine_module_imports_a_framework():
    found = []
    for module, path in modules().items():
        if not module.startswith("inloop_eval.engine"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in imported_names(module, path, node):
                    if name.split(".")[0] in FRAMEWORKS or name.startswith("inloop_eval.integrations"):
                        found.append(f"{module}:{node.lineno} imports {name}")
    assert found == []


def test_every_adapter_lives_in_the_engine_or_its_framework_package():
    """A class deriving from ModelAdapter is defined in engine/adapters/ (framework-neutral) or in
    integrations/<framework>/adapter.py, nowhere else."""
    homes = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and any(
                getattr(base, "id", getattr(base, "attr", "")) == "ModelAdapter" for base in node.bases
            ):
                homes.append((node.name, path.relative_to(PACKAGE).as_posix()))
    assert len(homes) >= 8, homes
    misplaced = [
        (name, where)
        for name, where in homes
        if not (where.startswith("engine/adapters/") or (where.startswith("integrations/") and where.endswith("/adapter.py")))
    ]
    assert misplaced == []


def test_the_frameworks_families_come_between_the_registered_and_the_neutral_ones():
    names = [family.name for family in families()]
    assert names == ["Hugging Face transformers", "OLMo-core", "hidden states and head", "logits"]


def test_a_family_matches_by_a_loaded_class_and_builds_through_its_path():
    assert loaded_class("collections:OrderedDict") is OrderedDict
    assert loaded_class("no_such_framework.model:Transformer") is None
    plugin = Framework(
        name="ordered", title="ordered", package="collections",
        model_class="collections:OrderedDict", adapter="inloop_eval.engine.adapters.logits:LogitsAdapter",
    )  # fmt: skip
    assert plugin.matches(OrderedDict()) and not plugin.matches({})
    family = ModelFamily("logits by path", plugin.matches, plugin.build_adapter)
    assert type(family.build(lambda ids: ids, 16)).__name__ == "LogitsAdapter"


def test_scoring_the_reference_gpt_loads_no_framework():
    code = (
        "import torch\n"
        "from inloop_eval.engine.families import make_adapter\n"
        "from inloop_eval.models.gpt import GPT, GPTConfig\n"
        "adapter = make_adapter(GPT(GPTConfig(vocab_size=64, max_seq_len=16, n_layers=1, n_heads=2, d_model=16)))\n"
        "import sys\n"
        f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules), type(adapter).__name__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["[]", "HiddenStatesAdapter"]


def test_an_unknown_object_is_refused_by_name():
    try:
        make_adapter(3)
    except TypeError as e:
        assert "found int" in str(e)
    else:
        raise AssertionError("make_adapter accepted an int")

