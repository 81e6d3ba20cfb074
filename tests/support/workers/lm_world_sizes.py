"""One rank of the `lm` evaluator at world sizes 1-3, on the domain files of `lm_helpers.write_domains` and a
JSONL file `broken.jsonl` beside them: the `lm` check of tests/support/workers/dist_checks.py, so the launches of
tests/test_distributed.py run it beside their other checks (world size 1 in the test's own process).

A clean evaluation, counting the model's forward calls and this rank's share of each label, then two that fail
(a model too small for the tokens; a JSONL file that only rank 0 reads, while building the cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lm_helpers import lm_entry, tiny_gpt

from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator

LABELS = ("code", "prose", "tiny")


def evaluate(data: Path, cache: Path, tokenizer: Any) -> dict:
    """This rank's three evaluations: what each returned, the forward calls and the share of the first; the
    token cache in `cache` (empty at first, so rank 0 builds it)."""
    files = {"code": data / "code", "prose": data / "prose.jsonl", "tiny": data / "tiny.npy"}
    model = tiny_gpt()
    calls = [0]
    hidden_states = model.hidden_states

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls[0] += 1
        return hidden_states(*args, **kwargs)

    model.hidden_states = counted
    evaluator = InLoopEvaluator(
        EvaluatorConfig(evaluators=[lm_entry(files, cache)], strict=True), tokenizer=tokenizer
    )
    metrics = evaluator.run(model)
    result = evaluator.detail("lm:" + ",".join(LABELS))
    shard = {label: int((result.shard.domain_S == d).sum()) for d, label in enumerate(LABELS)}

    lenient = EvaluatorConfig(evaluators=[lm_entry(files, cache)], strict=False)
    too_small = InLoopEvaluator(lenient, tokenizer=tokenizer).run(tiny_gpt(vocab_size=1000))
    broken = {**files, "prose": data / "broken.jsonl"}
    lenient = EvaluatorConfig(evaluators=[lm_entry(broken, cache)], strict=False)
    rank0_fails = InLoopEvaluator(lenient, tokenizer=tokenizer).run(model)
    return {
        "metrics": metrics,
        "calls": calls[0],
        "shard": shard,
        "too_small": too_small,
        "rank0_fails": rank0_fails,
    }
