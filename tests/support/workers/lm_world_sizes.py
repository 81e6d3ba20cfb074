"""One rank of the `lm` evaluator at world sizes 1-3 (tests/evaluators/test_perplexity_distributed.py), run by
`launch` on the domain files of `lm_helpers.write_domains` and a JSONL file `broken.jsonl` beside them:

    launch(N, [lm_world_sizes.py, --data DIR, --cache DIR, --tokenizer FILE, --out DIR])

A clean evaluation, counting the model's forward calls and this rank's share of each label, then two that fail
(a model too small for the tokens; a JSONL file that only rank 0 reads, while building the cache). Writes what
it saw to `<out>/rank<r>.json`.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from lm_helpers import lm_entry, tiny_gpt

from inloop_eval.data.tokenizer import load_tokenizer
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator

LABELS = ("code", "prose", "tiny")


def evaluate(data: Path, cache: Path, tokenizer_path: str) -> dict:
    """This rank's three evaluations: what each returned, the forward calls and the share of the first."""
    tokenizer = load_tokenizer(tokenizer_path)
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


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--data", "--cache", "--out"):
        parser.add_argument(flag, required=True, type=Path)
    parser.add_argument("--tokenizer", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        seen = evaluate(args.data, args.cache, args.tokenizer)
        (args.out / f"rank{dist.get_rank()}.json").write_text(json.dumps(seen))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
