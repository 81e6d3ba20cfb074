"""The configs, under the import path they had before each kind's config moved beside its evaluator (saved
scripts and user code import them from here). New code imports them from where they live:
`inloop_eval.evaluators.config` (EvaluatorConfig), `inloop_eval.evaluators.downstream` (TaskEvalConfig),
`inloop_eval.evaluators.perplexity` (LMEvalConfig), `inloop_eval.data.perplexity.domain_config`
(LMDomainConfig), `inloop_eval.config_fields` (the checks every config runs)."""

from inloop_eval.config_fields import AtLeast, build_dataclass, read_config_file
from inloop_eval.data.perplexity.domain_config import LMDomainConfig
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.downstream import TaskEvalConfig
from inloop_eval.evaluators.perplexity import LMEvalConfig

__all__ = [
    "AtLeast",
    "EvaluatorConfig",
    "LMDomainConfig",
    "LMEvalConfig",
    "TaskEvalConfig",
    "build_dataclass",
    "read_config_file",
]
