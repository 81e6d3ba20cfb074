"""The pinned scores: a seeded reference GPT on the first 200 documents of a few real tasks, whose figures
`pinned/icl_scores.json` holds (tests/evaluators/test_orchestrator.py checks that a change leaves them).

Regenerate the file only when a change is meant to move the numbers, and say why in the commit:

    python tests/support/pinned_scores.py
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from inloop_eval import EvaluatorConfig, InLoopEvaluator
from inloop_eval.data.fetch import fetch
from inloop_eval.data.root import default_data_root, neox_tokenizer_path
from inloop_eval.models.gpt import GPT, GPTConfig
from inloop_eval.tasks.splits import standard_splits

PINNED_TASKS = ("hellaswag", "piqa", "arc_easy", "mmlu_rc", "mmlu_mc")
N_DOCS = 200
PINNED_FILE = Path(__file__).resolve().parent / "pinned" / "icl_scores.json"


def pinned_model() -> GPT:
    """The tiny reference GPT (width 32, 2 layers) every pinned figure comes from, seeded."""
    torch.manual_seed(1234)
    return GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=1024))


def pinned_evaluator(data_root: Path, batch_tokens: int = 4096) -> InLoopEvaluator:
    """The evaluator of the pinned figures: the first N_DOCS documents of each PINNED_TASKS, strict."""
    config = EvaluatorConfig(
        evaluators=[{"task": t, "limit": N_DOCS, "batch_tokens": batch_tokens} for t in PINNED_TASKS],
        tokenizer=str(neox_tokenizer_path(data_root)),
        data_root=str(data_root),
        strict=True,
    )
    return InLoopEvaluator(config)


def main() -> None:
    root = fetch(default_data_root(), standard_splits())
    scores = pinned_evaluator(root).run(pinned_model())
    PINNED_FILE.write_text(json.dumps(scores, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(scores)} figures to {PINNED_FILE}")


if __name__ == "__main__":
    main()
