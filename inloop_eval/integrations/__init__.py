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
share.
"""

from __future__ import annotations

from inloop_eval.evaluators.measured import EvalSchedule, run_and_log
from inloop_eval.keys import SECONDS_KEY, TOKENS_KEY

__all__ = ["SECONDS_KEY", "TOKENS_KEY", "EvalSchedule", "run_and_log"]  # the keys as before
