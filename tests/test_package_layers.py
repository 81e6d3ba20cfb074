"""The folders show the architecture: imports run down the layers of docs/design.md only, the package root
stays small, every sub-package says what it holds, and no module grows past a size one can read whole."""

from __future__ import annotations

import ast
from pathlib import Path

from radon.complexity import cc_rank, cc_visit
from test_imports import PACKAGE, import_graph, modules

REPO = PACKAGE.parent

# Bottom to top, as docs/design.md lists them: a module may import from its own layer and the ones below.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "frameworks", "keys", "config_fields", "distributed"),
    ("metrics", "models"),
    ("data", "checkpoints"),
    ("tasks",),
    ("requests",),
    ("engine",),
    ("evaluators",),
    ("loggers",),
    ("report", "compare", "plan"),
    ("integrations", "demo", "watch"),
    ("cli",),
]
# Public entry points that re-export names from every layer: above them all.
PUBLIC = ("inloop_eval", "inloop_eval.config")
MAX_ROOT_MODULES = 8
MAX_MODULE_LINES = 450
MAX_SCRIPT_LINES = 400


def layer_of(module: str) -> int:
    """The layer of a package module by its first name under `inloop_eval`."""
    if module in PUBLIC:
        return len(LAYERS)
    top = module.split(".")[1]
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module} is in no layer of LAYERS; add it where it belongs (and to docs/design.md)")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`a imports b` for every import of a module from a higher layer."""
    return sorted(
        f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
        for a, targets in graph.items()
        for b in targets
        if layer_of(b) > layer_of(a)
    )


def test_the_layer_check_finds_an_upward_import():
    graph = {"inloop_eval.data.root": {"inloop_eval.tasks.base"}, "inloop_eval.tasks.base": {"inloop_eval.errors"}}
    assert upward_imports(graph) == [
        "inloop_eval.data.root (layer 2) imports inloop_eval.tasks.base (layer 3)"
    ]


def test_the_layer_check_finds_a_module_that_imports_the_command_line():
    """The command line is the top: what it runs (the demo, the watcher, the trainer hooks) cannot import it."""
    graph = {
        "inloop_eval.demo.run": {"inloop_eval.cli.progress"},
        "inloop_eval.watch.command": {"inloop_eval.cli.summary"},
        "inloop_eval.integrations.hf.callback": {"inloop_eval.cli.main"},
        "inloop_eval.cli.main": {"inloop_eval.demo.run", "inloop_eval.watch.command"},
    }
    assert upward_imports(graph) == [
        "inloop_eval.demo.run (layer 9) imports inloop_eval.cli.progress (layer 10)",
        "inloop_eval.integrations.hf.callback (layer 9) imports inloop_eval.cli.main (layer 10)",
        "inloop_eval.watch.command (layer 9) imports inloop_eval.cli.summary (layer 10)",
    ]


def test_imports_run_down_the_layers_only():
    assert upward_imports(import_graph()) == []


def test_the_package_root_holds_few_modules():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


def test_every_sub_package_docstring_names_its_modules():
    """Each sub-package's `__init__.py` opens with a docstring naming every module and sub-package in it."""
    missing = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        if init.parent == PACKAGE:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if not doc:
            missing.append(f"{init.relative_to(REPO)}: no docstring")
            continue
        parts = [p.stem for p in init.parent.glob("*.py") if p.stem not in ("__init__", "__main__")]
        parts += [p.name for p in init.parent.iterdir() if (p / "__init__.py").exists()]
        missing += [f"{init.relative_to(REPO)}: does not name {part!r}" for part in sorted(parts) if part not in doc]
    assert missing == []


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_is_too_long_to_read_whole():
    long = {name: line_count(path) for name, path in modules().items() if line_count(path) > MAX_MODULE_LINES}
    assert long == {}


def test_no_benchmark_or_script_is_too_long():
    paths = [*REPO.glob("benchmarks/*.py"), *REPO.glob("scripts/*.py")]
    long = {str(p.relative_to(REPO)): line_count(p) for p in paths if line_count(p) > MAX_SCRIPT_LINES}
    assert long == {}


def test_no_function_is_rated_d_or_worse_for_complexity():
    """radon's cyclomatic complexity: every function and method of the package rated A to C (at most 20
    branches), so each can be read whole."""
    worse = [
        f"{path.relative_to(REPO)}:{block.lineno} {block.name} {cc_rank(block.complexity)} ({block.complexity})"
        for path in sorted(PACKAGE.rglob("*.py"))
        for block in cc_visit(path.read_text())
        if cc_rank(block.complexity) not in "ABC"
    ]
    assert worse == []


def test_the_watcher_and_the_framework_packages_import_nothing_of_each_other():
    """Both use `checkpoints/` and `evaluators/measured`; neither reaches into the other."""
    graph = import_graph()
    crossing = sorted(
        f"{a} imports {b}"
        for a, targets in graph.items()
        for b in targets
        if {f"{a}.".split(".")[1], f"{b}.".split(".")[1]} == {"watch", "integrations"}
    )
    assert crossing == []
