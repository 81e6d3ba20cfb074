"""The kinds of evaluator, in one table: the `type:` of a config entry -> its evaluator class, which carries its
config class. The config's entry annotation (`EntryConfig`), the check of repeated labels and the
orchestrator's lookup all read it, so a new kind of evaluation is one new module (a config dataclass and an
`Evaluator` subclass) and one entry here.
"""

from __future__ import annotations

import functools
import operator

from inloop_eval.evaluators.base import Evaluator, entry_type
from inloop_eval.evaluators.downstream import DownstreamEvaluator
from inloop_eval.evaluators.perplexity import PerplexityEvaluator

# Keyed by each config class's `type` default; the first kind is the one an entry without `type:` selects.
KINDS: dict[str, type[Evaluator]] = {
    entry_type(kind.config_class): kind for kind in (DownstreamEvaluator, PerplexityEvaluator)
}

# An entry of `EvaluatorConfig.evaluators`: any kind's config class, `TaskEvalConfig | LMEvalConfig | ...`
# (a mapping is built into the one its `type:` selects).
EntryConfig = functools.reduce(operator.or_, [kind.config_class for kind in KINDS.values()])
