"""What the benchmarks measure, and the requests and scores they compare.

Each benchmark runs our evaluator and a baseline in one process on the same model and documents. Figures:
tokens forwarded, counted at the model's input embedding (padding included); wall seconds and extra peak
RSS of one evaluation; the token minimum of the requests scored (each distinct context once plus every
continuation but its last token); and each document's prediction (the argmax of its choices' scores), compared per document.

Our side is reached only through the package's public API (`InLoopEvaluator.run`, `tokens_forwarded`,
`detail(name)`), the task registry, and `build_requests`, the function that tokenizes a task's requests
for the evaluator: a baseline forwards the very requests we score, token for token.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from inloop_eval import AdapterNeeds, ForwardInputs, InLoopEvaluator, ModelAdapter, ProjectedHead
from inloop_eval.engine.flex_kernel import sequence_length
from inloop_eval.models.gpt import GPT, GPTConfig
from inloop_eval.requests.table import RequestTable, build_requests
from inloop_eval.tasks import get_task, load_docs

# Every benchmark model's context length, and the longest input its requests are tokenized for.
MAX_LENGTH = 2048

Scores = dict[tuple[int, int], float]  # a score per (doc_id, cont_id)


# ---- models: random, seeded, of one shape (hidden 256, 4 layers, the NeoX vocabulary padded to 50304)


def neox_model() -> torch.nn.Module:
    """A Hugging Face GPT-NeoX model (every engine can call it)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPTNeoXConfig(
        vocab_size=50304,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=MAX_LENGTH,
    )
    return transformers.GPTNeoXForCausalLM(config).eval()


def reference_gpt(d_model: int = 256, n_layers: int = 4) -> torch.nn.Module:
    """The package's reference GPT (ours and the naive loop call it), seeded; width 256 and 4 layers unless
    asked otherwise."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50304, d_model=d_model, n_layers=n_layers, n_heads=4, max_seq_len=MAX_LENGTH)
    return GPT(config).eval()


def logits_of(model: torch.nn.Module) -> Any:
    """input_ids [B, T] -> logits [B, T, V], for the baselines that call the model themselves."""
    if isinstance(model, GPT):
        return lambda ids: model(ids)
    return lambda ids: model(input_ids=ids, use_cache=False).logits


# ---- measuring


def input_embedding(model: torch.nn.Module) -> torch.nn.Module:
    """The input embedding of the reference GPT, an OLMo-core Transformer or a Hugging Face model."""
    if isinstance(model, GPT):
        return model.tok_emb
    if isinstance(getattr(model, "embeddings", None), torch.nn.Embedding):  # OLMo-core's Transformer
        return model.embeddings
    return model.get_input_embeddings()


class TokenCounter:
    """Counts tokens fed to a model, padding included, at its input embedding."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.tokens = 0
        self.handle = input_embedding(model).register_forward_pre_hook(self._count)

    def _count(self, module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        self.tokens += int(args[0].numel())

    def close(self) -> None:
        self.handle.remove()


class PlanOnly(ModelAdapter):
    """A model that takes packed rows (and, with `prefix_reuse`, keeps prefixes) and computes nothing
    (equal logits everywhere): a run through it counts, in `tokens_forwarded`, what the planner would send
    such a model, and in `lengths` the sequence lengths the block rendering would arrange its batches in
    (`flex_kernel.sequence_length`: one compiled graph each) with the keys (kept prefix and rows) each held."""

    def __init__(self, vocab_size: int, max_length: int, prefix_reuse: bool = False) -> None:
        super().__init__(None)
        self.vocab_size, self.max_length, self.prefix_reuse = vocab_size, max_length, prefix_reuse
        self.head = nn.Linear(1, vocab_size, bias=False)
        nn.init.zeros_(self.head.weight)
        self.lengths: list[tuple[int, int]] = []

    @property
    def needs(self) -> AdapterNeeds:
        return AdapterNeeds(packing=True, prefix_reuse=self.prefix_reuse)

    def forward(self, inputs: ForwardInputs) -> ProjectedHead:
        if inputs.keeps_prefix and inputs.prefix is not None:
            inputs.prefix.states = ()
        kept = inputs.prefix.length if inputs.prefix is not None and not inputs.keeps_prefix else 0
        keys = kept + inputs.input_ids_BT.numel()
        self.lengths.append((sequence_length(keys), keys))
        return ProjectedHead(torch.zeros((inputs.rows_U.shape[0], 1)), self.head)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def measured(model: torch.nn.Module) -> Iterator[dict[str, float]]:
    """Wall seconds, tokens forwarded and extra peak RSS (sampled every 5 ms) of the block."""
    out: dict[str, float] = {}
    start_rss, peak = rss_bytes(), [rss_bytes()]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], rss_bytes())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    counter = TokenCounter(model)
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        out["wall_s"] = time.perf_counter() - t0
        done.set()
        thread.join()
        counter.close()
        out["tokens"] = counter.tokens
        out["peak_rss_mib"] = (max(peak[0], rss_bytes()) - start_rss) / 2**20


def run_twice(
    evaluator: InLoopEvaluator,
    model: Any,
    counted: torch.nn.Module,
    reset: Callable[[], None] | None = None,
) -> tuple[dict[str, float], dict[str, float]]:
    """Our evaluation as a training run sees it from its second evaluation on: a first run loads,
    tokenizes and plans the tasks (and pays the model's first-call costs), the second is measured. The
    public API runs preparation only inside a first run, so it is not timed apart.

    model: what `run` is given; counted: the module whose embedding counts the tokens; reset: called
        between the runs (to zero a wrapper's own counters).
    Returns the second run's metrics and its measurements (`measured`), with `first_run_s`: the first
    run's wall seconds.
    """
    t0 = time.perf_counter()
    evaluator.run(model)
    first_run_s = time.perf_counter() - t0
    if reset is not None:
        reset()
    with measured(counted) as m:
        metrics = evaluator.run(model)
    m["first_run_s"] = first_run_s
    return metrics, m


def task_requests(
    task_id: str, tokenizer: Any, data_root: Path, limit: int | None, *, with_uncond: bool, spread: bool = False
) -> RequestTable:
    """The requests of the task's first `limit` documents (None: all; with `spread`, `limit` documents
    evenly spaced over the split), tokenized as our evaluator tokenizes them."""
    task = get_task(task_id)
    docs = load_docs(task, data_root, limit=limit, spread=spread)
    return build_requests(task, docs, tokenizer, MAX_LENGTH, with_uncond=with_uncond)


def our_scores(result: Any, table: RequestTable) -> Scores:
    """Our loglikelihood per (doc_id, cont_id) in `result`, an evaluator's `detail(name)` after a run in
    one process, which scores every row of the task's request table; `task_requests` rebuilds that table
    (the same documents, tokenizer and length, with the unconditional requests iff it scored some)."""
    if result is None:
        raise RuntimeError("our evaluator failed (see the log above)")
    rows = result.rows
    if sorted(rows.tolist()) != list(range(len(table))) or len(result.uncond_ids) != len(table.uncond):
        raise RuntimeError(
            f"task {table.task!r}: the evaluator scored {len(rows)} requests and {len(result.uncond_ids)} "
            f"unconditional ones, the rebuilt table holds {len(table)} and {len(table.uncond)}"
        )
    keys = zip(table.doc_id[rows].tolist(), table.cont_id[rows].tolist(), strict=True)
    return dict(zip(keys, result.scores.ll[: len(rows)].tolist(), strict=True))


def minimum_tokens(contexts: Iterable[Iterable[int]], continuations: Iterable[Iterable[int]]) -> int:
    """The least an evaluator sharing contexts must forward for these requests: each distinct context once
    plus every continuation but its last token (read at the position before it, never fed)."""
    distinct = {tuple(c) for c in contexts}
    return sum(len(c) for c in distinct) + sum(max(len(list(c)) - 1, 0) for c in continuations)


def trie_minimum(sequences: Iterable[Iterable[int]]) -> int:
    """The least an evaluator sharing every common prefix must forward: the nodes of a prefix trie over the
    rows the requests would have alone (context + continuation[:-1]), built token by token."""
    children: dict[tuple[int, int], int] = {}
    for sequence in sequences:
        node = 0
        for token in sequence:
            node = children.setdefault((node, int(token)), len(children) + 1)
    return len(children)


def table_rows(table: RequestTable, *, with_uncond: bool = False) -> list[np.ndarray]:
    """Every request's own row (context + continuation[:-1]), and the unconditional requests' with them."""
    sets = [table.pairs, table.uncond] if with_uncond else [table.pairs]
    return [np.concatenate([s.context(p), s.continuation(p)[:-1]]) for s in sets for p in range(len(s))]


def table_minimum(table: RequestTable, *, with_uncond: bool = False) -> int:
    """`minimum_tokens` of every request of a table (and of its unconditional requests)."""
    sets = [table.pairs, table.uncond] if with_uncond else [table.pairs]
    contexts = [s.context(p) for s in sets for p in range(len(s))]
    continuations = [s.continuation(p) for s in sets for p in range(len(s))]
    return minimum_tokens(contexts, continuations)


def argmax_per_doc(scores: Scores) -> dict[int, int]:
    """Prediction per document: argmax of its choices' scores, ties to the lowest index."""
    by_doc: dict[int, dict[int, float]] = {}
    for (doc, cont), value in scores.items():
        by_doc.setdefault(doc, {})[cont] = value
    return {doc: int(np.argmax([conts[c] for c in sorted(conts)])) for doc, conts in by_doc.items()}


def agreement(ours: Scores, theirs: Scores) -> dict[str, Any]:
    """Documents predicted alike, the largest score difference, and for each document predicted
    differently how far apart the two choices' scores are in ours (a near tie explains a flip)."""
    mine, other = argmax_per_doc(ours), argmax_per_doc(theirs)
    docs = sorted(set(mine) & set(other))
    differ = [d for d in docs if mine[d] != other[d]]
    common = set(ours) & set(theirs)
    return {
        "same_predictions": len(docs) - len(differ),
        "documents": len(docs),
        "documents_only_one_side": len(set(mine) ^ set(other)),
        "max_abs_score_diff": max((abs(ours[k] - theirs[k]) for k in common), default=float("nan")),
        "differing_docs_margin": {d: abs(ours[(d, mine[d])] - ours[(d, other[d])]) for d in differ},
    }


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def naive_accuracy(table: RequestTable, ll: Scores, uncond: Scores) -> dict[str, float]:
    """The per-request Python metric of OLMo's in-loop evaluator: dicts per document, argmax and accuracy
    (acc, and acc_pmi from each request's unconditional score) by loops."""
    gold = {(int(d), int(c)) for d, c, g in zip(table.doc_id, table.cont_id, table.is_gold, strict=True) if g}
    by_doc: dict[int, list[tuple[int, float, float]]] = {}
    for (doc, cont), value in ll.items():
        by_doc.setdefault(doc, []).append((cont, value, value - uncond.get((doc, cont), 0.0)))
    correct = [0.0, 0.0]
    for doc, conts in by_doc.items():
        for k in (1, 2):
            best = max(conts, key=lambda x: x[k])[0]
            correct[k - 1] += (doc, best) in gold
    n = max(len(by_doc), 1)
    return {"acc": correct[0] / n, "acc_pmi": correct[1] / n}
