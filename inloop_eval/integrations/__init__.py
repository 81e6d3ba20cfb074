"""Calling the evaluator from a training loop, with its cost measured and the figures logged.

The plain loop needs nothing from here (`if evaluator.should_run(step): evaluator.run(model, step=step)`);
`run_and_log` adds the wall time and tokens forwarded and hands the result to a logger (both it and
`EvalSchedule` live beside the orchestrator, `inloop_eval.evaluators.measured`, and are importable from here). Each framework has
one package here holding everything it needs (its adapter, how its attention and positions are routed during
an evaluation, its parallel topology, its trainer hook, its perplexity where it has one): `.olmo_core`
(`callback`: OLMo-core's downstream and perplexity callbacks), `.hf` and `.lightning` (`callback`: the
Hugging Face `Trainer` and Lightning callbacks), `.torchtitan` (`validator`: torchtitan's validator slot, which
torchtitan calls when it decides) and `.megatron` (`adapter`: a Megatron-core `GPTModel` in its training
parallelism; Megatron-LM's loop makes the two calls itself). The callbacks decide when to evaluate with
`EvalSchedule`; `callback_config` holds the fields and checks the OLMo-core and torchtitan callback configs
share. Each framework's package declares its plugin in `plugin` (`inloop_eval.frameworks.Framework`: its
model class and adapter, its checkpoint format in `checkpoint`, its key style, its trainer hooks), and
`plugins` lists the built-in plugins: the one table naming them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inloop_eval.evaluators.measured import EvalSchedule, run_and_log
    from inloop_eval.keys import SECONDS_KEY, TOKENS_KEY

# The names importable from here as before, each imported from its module on first use: importing a plugin
# declaration (`plugins`) loads no evaluator.
_EXPORTS = {
    "EvalSchedule": "inloop_eval.evaluators.measured",
    "run_and_log": "inloop_eval.evaluators.measured",
    "SECONDS_KEY": "inloop_eval.keys",
    "TOKENS_KEY": "inloop_eval.keys",
}

__all__ = ["SECONDS_KEY", "TOKENS_KEY", "EvalSchedule", "run_and_log"]


def __getattr__(name: str) -> Any:
    """A name importable from here, imported from its module the first time it is asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'inloop_eval.integrations' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
