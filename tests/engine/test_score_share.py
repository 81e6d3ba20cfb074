"""The one scoring call every evaluator makes (`engine.evaluation.score_share`): given the batches an evaluator
planned for this rank, it gives the scores `run_batches` gives for the same batches, counts the tokens it forwards, agrees after the last forward, and tells a progress display the
total. No evaluator module scores by itself."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import torch
from helpers import two_documents

from inloop_eval.distributed import TaskAgreement
from inloop_eval.engine.adapter import TokenCount
from inloop_eval.engine.batching import BatchShape, plan_batches
from inloop_eval.engine.evaluation import EvalContext, Share, score_share
from inloop_eval.engine.families import make_adapter
from inloop_eval.engine.scoring import run_batches
from inloop_eval.models.gpt import GPT, GPTConfig

EVALUATORS = Path(__file__).resolve().parents[2] / "inloop_eval" / "evaluators"


class Progress:
    def __init__(self) -> None:
        self.started: list[tuple[str, int]] = []
        self.done = 0

    def start(self, title: str, total: int) -> None:
        self.started.append((title, total))

    def __call__(self, n: int) -> None:
        self.done += n


def test_the_share_is_scored_as_run_batches_scores_it():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, max_seq_len=32)).eval()
    adapter = make_adapter(model)
    pairs, pair_ids = two_documents(), np.array([4, 0, 2, 3, 1])
    shape = BatchShape.of(adapter.needs)
    batches = plan_batches(pairs, pair_ids, 16, BatchShape(packing=shape.packing), max_length=32)
    progress, tokens = Progress(), TokenCount()
    context = EvalContext(adapter, 32, None, shape, tokens, progress=progress)
    agreement = TaskAgreement("toy task")
    with torch.no_grad():
        scores = score_share(context, agreement, "toy task", Share(batches, len(pair_ids), lambda p: f"pair {p}"))
        expected = run_batches(adapter, batches, 5, TokenCount())
    np.testing.assert_array_equal(scores.ll, expected.ll)
    np.testing.assert_array_equal(scores.greedy, expected.greedy)
    assert tokens.total == expected.tokens_forwarded > 0
    assert progress.started == [("toy task", 5)] and progress.done == 5


def test_no_evaluator_module_runs_batches_itself():
    calls = []
    for path in sorted(EVALUATORS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = getattr(node, "id", None) or getattr(node, "attr", None)
            if name in ("run_batches", "equalize_forward_calls"):
                calls.append(f"{path.name}:{node.lineno} {name}")
    assert calls == []
