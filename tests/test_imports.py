"""The package's import graph, read from the source with `ast`: no module imports itself round a circle, and
imports sit at the top of modules (inside functions only for the optional dependencies and `datasets`; the
CLI's table names each command's module by import path and imports it when that command runs, and each
framework's plugin names its parts so: edges of the graph like any import). And what importing costs,
counted in modules loaded (run in a fresh interpreter), never timed: `import inloop_eval` and
`inloop-eval --help` load no heavy dependency (no torchmetrics, transformers, scipy or matplotlib), the
training loop's names and an evaluator built from a config load torch but neither torchmetrics (the metrics'
base) nor anything only a command needs, and the first evaluation loads torchmetrics (each kind names its
metric by import path, beside a type-checking import of it: an edge of the graph like any import).

Every `import` statement counts, wherever it stands (inside functions and `if TYPE_CHECKING:` too). An import
of a package (its `__init__.py`) is not an edge: a package's `__init__` imports its own modules, and each of
them imports its siblings through the package.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import inloop_eval
from inloop_eval.cli.main import COMMANDS
from inloop_eval.frameworks import Framework

PACKAGE = Path(inloop_eval.__file__).parent
# datasets is a dependency, but importing it (with pandas and pyarrow) costs most of a second: the functions
# that read a split import it, or pyarrow alone for a plain saved split.
OPTIONAL = ("wandb", "matplotlib", "transformers", "lightning", "olmo_core", "datasets", "pyarrow")
# What neither the package nor its command line may load before a command needs it.
HEAVY = ("transformers", "scipy", "matplotlib", "pandas", "datasets", "pyarrow", "torchmetrics", "wandb", "lightning")
# torchmetrics, and what its package import pulls in where installed: loaded with the metric modules only.
METRICS_BASE = ("torchmetrics", "transformers", "scipy", "matplotlib")
# What only a command needs (reading a split, logging to W&B, Lightning's callback): never the training loop's.
COMMAND_ONLY = ("pandas", "datasets", "pyarrow", "wandb", "lightning")


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imported_names(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def import_graph() -> dict[str, set[str]]:
    """module -> the package's (non-package) modules it imports, the command line's table naming the
    module of each command included."""
    mods = modules()
    graph: dict[str, set[str]] = {}
    for module, path in mods.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in imported_names(module, path, node):
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name and name != module and mods[name].name != "__init__.py":
                    edges.add(name)
        graph[module] = edges
    graph["inloop_eval.cli.main"] |= {name for command in COMMANDS for name in (command.module, command.flags) if name}
    for plugin_module, plugin in built_in_plugins().items():
        paths = [plugin.adapter, plugin.attention, plugin.checkpoint, plugin.key_style, *plugin.trainer_hooks]
        graph[plugin_module] |= {p.partition(":")[0] for p in paths if p and p.startswith("inloop_eval.")}
    return graph


def built_in_plugins() -> dict[str, Framework]:
    """Each framework package's plugin module and the plugin it declares, whose import paths are edges of
    the graph like any import (each part is imported when first used)."""
    found = {}
    for path in sorted(PACKAGE.glob("integrations/*/plugin.py")):
        module = f"inloop_eval.integrations.{path.parent.name}.plugin"
        found[module] = importlib.import_module(module).FRAMEWORK
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle found by a depth-first search (each reported once per back edge)."""
    state: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(u: str) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                found.append(stack[stack.index(v) :] + [v])
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = 2

    for u in sorted(graph):
        if u not in state:
            visit(u)
    return found


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 40 and graph["inloop_eval.evaluators.downstream"] >= {"inloop_eval.engine.scoring", "inloop_eval.requests.table"}
    assert cycles(graph) == []


def test_imports_inside_functions_are_only_optional_dependencies():
    misplaced = []
    for module, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = imported_names(module, path, node)
                    if names[0].split(".")[0] not in OPTIONAL:
                        misplaced.append(f"{module}:{node.lineno} imports {names[0]}")
    assert misplaced == []


LOADED_MARK = "modules loaded: "


def modules_loaded_by_steps(*steps: str) -> list[set[str]]:
    """The top-level names in `sys.modules` after each of `steps`, run in turn in one fresh interpreter."""
    report = f"import json, sys\nprint({LOADED_MARK!r} + json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    script = "\n".join(f"{step}\n{report}" for step in steps)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [line.removeprefix(LOADED_MARK) for line in proc.stdout.splitlines() if line.startswith(LOADED_MARK)]
    assert len(reports) == len(steps), proc.stdout[-3000:]
    return [set(json.loads(r)) for r in reports]


def modules_loaded(code: str) -> set[str]:
    """The top-level names in `sys.modules` after running `code` in a fresh interpreter."""
    return modules_loaded_by_steps(code)[0]


def test_importing_the_package_loads_no_dependency():
    loaded = modules_loaded("import inloop_eval")
    assert not loaded & {*HEAVY, *METRICS_BASE, "torch", "numpy", "yaml", "tokenizers"}


def test_the_command_lines_help_loads_no_dependency():
    code = "from inloop_eval.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    loaded = modules_loaded(code)
    assert not loaded & {*HEAVY, *METRICS_BASE, "torch", "numpy", "yaml"}


def test_evaluates_help_and_the_task_list_load_no_torch():
    """`inloop-eval evaluate --help` reads only the command's flags, and `inloop-eval tasks` only the task
    registry: neither waits seconds for torch (benchmarks/cli_startup.py times them)."""
    help_code = "from inloop_eval.cli import main\ntry:\n    main(['evaluate', '--help'])\nexcept SystemExit:\n    pass"
    tasks_code = "from inloop_eval.cli import main\nassert main(['tasks']) == 0"
    for code in (help_code, tasks_code):
        loaded = modules_loaded(code)
        assert not loaded & {*HEAVY, *METRICS_BASE, "torch"}, code


def test_the_metric_modules_load_torchmetrics():
    """What the two tests above keep out is what the metrics' modules bring in (so they can fail)."""
    loaded = modules_loaded("import inloop_eval.metrics.icl_metric, inloop_eval.metrics.perplexity_metric")
    assert "torchmetrics" in loaded


def test_the_training_loop_loads_torchmetrics_at_its_first_evaluation_only(data_root, tmp_path):
    """torchmetrics' package import pulls in transformers, scipy and matplotlib where installed (seconds per
    process: docs/design.md), so a training process pays it when it first evaluates (a task and a perplexity
    domain, each kind's metric), not when it imports the training loop's names or builds its evaluator from
    the config; nor do those two load what only a command needs. One fresh interpreter, step by step."""
    np.arange(2 * 64, dtype=np.uint16).tofile(tmp_path / "code.npy")
    entries = [
        {"task": "piqa", "limit": 2},
        {"type": "lm", "seq_len": 64, "domains": [{"label": "code", "paths": [str(tmp_path / "code.npy")]}]},
    ]
    names = "from inloop_eval import EvaluatorConfig, InLoopEvaluator, run_and_log"
    build = (
        "from inloop_eval.data.root import neox_tokenizer_path\n"
        "from inloop_eval.models.gpt import GPT, GPTConfig\n"
        f"root = {str(data_root)!r}\n"
        f"config = EvaluatorConfig(evaluators={entries!r}, data_root=root, strict=True,\n"
        "                         tokenizer=str(neox_tokenizer_path(root)))\n"
        "evaluator = InLoopEvaluator(config)\n"
        "assert list(evaluator.evaluators) == ['piqa', 'lm:code']"
    )
    evaluate = (
        "metrics = evaluator.run(GPT(GPTConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=256)))\n"
        "assert metrics['eval/downstream/piqa/n_docs'] == 2 and 'eval/lm/code/ppl' in metrics, metrics"
    )
    imported, built, evaluated = modules_loaded_by_steps(names, build, evaluate)
    for loaded in (imported, built):
        assert "torch" in loaded and not loaded & {*METRICS_BASE, *COMMAND_ONLY}
    assert "torchmetrics" in evaluated


def test_the_per_document_outcomes_load_no_torchmetrics():
    """The loggers and the report and compare commands read `DocumentOutcomes` without the metrics' base."""
    loaded = modules_loaded("import inloop_eval.metrics.icl, inloop_eval.loggers.outcomes, inloop_eval.compare.pairing")
    assert "torch" in loaded and not loaded & set(METRICS_BASE)


def test_every_public_name_is_importable_from_the_package():
    for name in inloop_eval.__all__:
        assert getattr(inloop_eval, name).__name__ == name
    assert sorted(dir(inloop_eval)) == sorted(set(dir(inloop_eval)) | set(inloop_eval.__all__))


def test_the_report_and_compare_commands_load_no_heavy_dependency():
    code = (
        "from inloop_eval.cli.main import build_parser\n"
        "build_parser('report'); build_parser('compare')"
    )
    assert not modules_loaded(code) & {*METRICS_BASE, "pandas", "datasets"}


def test_a_missing_hf_extra_is_reported_before_torch_is_imported():
    """`evaluate` without transformers (hidden here) says which extra to install, having loaded no torch."""
    code = (
        "import importlib.util, sys\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'transformers' else real(name, *a)\n"
        "from inloop_eval.cli import main\n"
        "assert main(['evaluate', '--model', 'm', '--tasks', 'piqa']) == 2\n"
        "assert 'torch' not in sys.modules"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pip install 'inloop_eval[hf]'" in proc.stderr


def test_a_clone_named_like_the_package_says_it_shadows_the_package(tmp_path):
    """Python run from the folder holding a clone named `inloop_eval` finds the clone first: its top-level
    `__init__.py` makes that a clear error instead of an empty namespace package."""
    clone = tmp_path / "inloop_eval"
    clone.mkdir()
    (clone / "__init__.py").write_text((PACKAGE.parent / "__init__.py").read_text())
    code = "from inloop_eval import InLoopEvaluator"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1
    assert f"'inloop_eval' resolved to {clone.resolve()}, the clone of the repository" in proc.stderr
