"""In-loop evaluation for language-model training.

The extension points: `InLoopEvaluator` and its configs (`EvaluatorConfig` with `TaskEvalConfig` and
`LMEvalConfig` entries), `run_and_log` for a training loop, `ModelAdapter` (with `LayoutNeeds`,
`ForwardInputs`, the output layouts `FullLogits`, `ProjectedHead`, `VocabSharded`, and `register_layout`)
for a model we do not know how to call, `MultipleChoiceTask` + `register` for a task of your own, and `Evaluator` / `EvalOutput` for a new kind
of evaluation. docs/design.md describes how they fit together.
"""

from inloop_eval.config import EvaluatorConfig, LMEvalConfig, TaskEvalConfig
from inloop_eval.engine.layout import ForwardInputs, LayoutNeeds, ModelAdapter
from inloop_eval.engine.layouts.full_logits import FullLogits
from inloop_eval.engine.layouts.projected_head import ProjectedHead
from inloop_eval.engine.layouts.vocab_sharded import VocabSharded
from inloop_eval.engine.registry import LayoutEntry, register_layout
from inloop_eval.evaluators.base import EvalOutput, Evaluator
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.integrations import run_and_log
from inloop_eval.tasks import MultipleChoiceTask, register

__all__ = [
    "EvalOutput",
    "Evaluator",
    "EvaluatorConfig",
    "ForwardInputs",
    "FullLogits",
    "InLoopEvaluator",
    "LMEvalConfig",
    "LayoutEntry",
    "LayoutNeeds",
    "ModelAdapter",
    "ProjectedHead",
    "MultipleChoiceTask",
    "TaskEvalConfig",
    "register",
    "VocabSharded",
    "register_layout",
    "run_and_log",
]
