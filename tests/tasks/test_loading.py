"""Which documents `limit` loads: the first ones, or with `spread` as many evenly spaced over the whole split
(every subset in proportion), each with the index and few-shot examples it has in a full load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inloop_eval import EvaluatorConfig, InLoopEvaluator
from inloop_eval.models.gpt import GPT, GPTConfig
from inloop_eval.tasks import get_task, load_docs
from inloop_eval.tasks.loading import spread_positions

SUBSETS_TASK = "olmo:mmlu_humanities_test_mc_5shot_fast"  # 13 subjects, each with its own shots


@pytest.mark.parametrize(("n_docs", "limit"), [(10, 3), (10, 10), (10, 25), (7, 1), (1000, 999), (4705, 100)])
def test_spread_positions_are_distinct_evenly_spaced_and_span_the_split(n_docs: int, limit: int) -> None:
    positions = spread_positions(n_docs, limit)
    expected = np.arange(n_docs) if limit >= n_docs else np.floor(np.linspace(0, n_docs - 1, limit) + 1e-9)
    assert positions.tolist() == expected.astype(int).tolist()
    assert len(set(positions.tolist())) == min(n_docs, limit)
    if limit > 1:
        assert positions[0] == 0 and positions[-1] == n_docs - 1


def test_spread_docs_are_the_full_loads_docs_at_those_positions(data_root: Path) -> None:
    task = get_task(SUBSETS_TASK)
    full = load_docs(task, data_root)
    spread = load_docs(task, data_root, limit=40, spread=True)
    positions = spread_positions(len(full), 40).tolist()
    assert [d.index for d in spread] == positions
    assert spread == [full[i] for i in positions]  # the same prompt, shots included, as in a full evaluation
    first = load_docs(task, data_root, limit=40)
    assert [d.index for d in first] == list(range(40)) and first == full[:40]
    subjects = {
        c.split("\n\n")[0] for d in spread for c in d.contexts[:1]
    }  # each prompt opens with its subject
    assert len(subjects) > len({c.split("\n\n")[0] for d in first for c in d.contexts[:1]})


def test_an_evaluation_with_spread_scores_the_spread_documents(data_root: Path, neox_tokenizer) -> None:
    entry = {"task": SUBSETS_TASK, "limit": 6, "spread": True, "metrics": ["acc"]}
    ev = InLoopEvaluator(
        EvaluatorConfig(evaluators=[entry], data_root=str(data_root), strict=True), tokenizer=neox_tokenizer
    )
    model = GPT(GPTConfig(vocab_size=50304, d_model=32, n_layers=1, n_heads=2, max_seq_len=2048)).eval()
    metrics = ev.run(model)
    n_all = len(load_docs(get_task(SUBSETS_TASK), data_root))
    result = ev.detail(SUBSETS_TASK)
    scored = np.unique(result.prepared.table.doc_id[result.rows])
    assert scored.tolist() == spread_positions(n_all, 6).tolist()
    assert any(k.endswith("/acc") for k in metrics)
