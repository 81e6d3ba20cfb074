"""In-loop evaluation for language-model training."""

from inloop_eval.config import EvaluatorConfig, TaskEvalConfig
from inloop_eval.evaluator import InLoopEvaluator

__all__ = ["EvaluatorConfig", "InLoopEvaluator", "TaskEvalConfig"]
