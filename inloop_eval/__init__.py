"""In-loop evaluation for language-model training.

The extension points: `InLoopEvaluator` and its configs (`EvaluatorConfig` with `TaskEvalConfig` and
`LMEvalConfig` entries), `run_and_log` for a training loop, `ModelAdapter` (with `AdapterNeeds`,
`ForwardInputs`, the output forms `FullLogits`, `ProjectedHead`, `VocabSharded`, and `register_model_family`)
for a model we do not know how to call, `Framework` + `register_framework` for a training framework's
plugin, `MultipleChoiceTask` + `register` for a task of your own, and `Evaluator` / `EvalOutput` for a new
kind of evaluation. docs/design.md describes how they fit together.

Importing the package registers the built-in framework plugins (`integrations/plugins.py`), which import
nothing of their frameworks. Each name is imported from its module on first use, so that `import
inloop_eval` (and the command line, which imports it first) costs nothing until a name is used: `from inloop_eval import InLoopEvaluator`
imports the training loop's modules and torch, nothing of a command's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from inloop_eval.frameworks import register_built_in
from inloop_eval.integrations.plugins import BUILT_IN

# The frameworks the engine, the evaluators and the watcher consult: declared by import path, so registering
# them imports none.
register_built_in(BUILT_IN)

if TYPE_CHECKING:
    from inloop_eval.config import EvaluatorConfig, LMEvalConfig, TaskEvalConfig
    from inloop_eval.engine.adapter import AdapterNeeds, ForwardInputs, ModelAdapter
    from inloop_eval.engine.families import ModelFamily, register_model_family
    from inloop_eval.engine.outputs.full_logits import FullLogits
    from inloop_eval.engine.outputs.projected_head import ProjectedHead
    from inloop_eval.engine.outputs.vocab_sharded import VocabSharded
    from inloop_eval.evaluators.base import EvalOutput, Evaluator
    from inloop_eval.evaluators.measured import run_and_log
    from inloop_eval.evaluators.orchestrator import InLoopEvaluator
    from inloop_eval.frameworks import Framework, register_framework
    from inloop_eval.tasks import MultipleChoiceTask, register

# Each public name -> the module that defines it.
_EXPORTS = {
    "EvalOutput": "inloop_eval.evaluators.base",
    "Evaluator": "inloop_eval.evaluators.base",
    "EvaluatorConfig": "inloop_eval.config",
    "ForwardInputs": "inloop_eval.engine.adapter",
    "Framework": "inloop_eval.frameworks",
    "register_framework": "inloop_eval.frameworks",
    "FullLogits": "inloop_eval.engine.outputs.full_logits",
    "InLoopEvaluator": "inloop_eval.evaluators.orchestrator",
    "LMEvalConfig": "inloop_eval.config",
    "ModelFamily": "inloop_eval.engine.families",
    "AdapterNeeds": "inloop_eval.engine.adapter",
    "ModelAdapter": "inloop_eval.engine.adapter",
    "MultipleChoiceTask": "inloop_eval.tasks",
    "ProjectedHead": "inloop_eval.engine.outputs.projected_head",
    "TaskEvalConfig": "inloop_eval.config",
    "VocabSharded": "inloop_eval.engine.outputs.vocab_sharded",
    "register": "inloop_eval.tasks",
    "register_model_family": "inloop_eval.engine.families",
    "run_and_log": "inloop_eval.evaluators.measured",
}

__all__ = [
    "EvalOutput",
    "Evaluator",
    "EvaluatorConfig",
    "ForwardInputs",
    "Framework",
    "FullLogits",
    "InLoopEvaluator",
    "LMEvalConfig",
    "ModelFamily",
    "AdapterNeeds",
    "ModelAdapter",
    "ProjectedHead",
    "MultipleChoiceTask",
    "TaskEvalConfig",
    "register",
    "VocabSharded",
    "register_framework",
    "register_model_family",
    "run_and_log",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module the first time it is asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'inloop_eval' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
