"""Our evaluator against the evaluators users would otherwise run, on native tasks, in one process.

Engines, on the same model and the same documents:
- `ours`: `InLoopEvaluator.run` (prefix sharing, one row per letter-key document, continuation-only
  log-probs), scoring every request and, with `--pmi`, the unconditional (PMI) requests its tasks report.
  Measured on its second run, as every evaluation of a training run after its first: the first run loads,
  tokenizes and plans (its seconds are `first_run_s` in the JSON; `prep s` is n/a).
- `naive`: the OLMo in-loop algorithm, written here: one row per request (and per request's unconditional
  row, with `--pmi`), in dataset order, padded to a multiple of 128, the context recomputed for every
  choice, a float32 log-softmax over [B, T, V], and a per-request Python metric.
- `olmo_eval`: `ai2-olmo-eval`'s pipeline (`build_task`, its `collate_fn`, its `ICLMetric`), when installed;
  only for tasks whose documents and tokens match ours (checked request by request).
- `lm_eval`: lm-evaluation-harness's `HFLM(pretrained=<model>, tokenizer=...).loglikelihood` on our
  (context, continuation) strings, when installed (it needs `accelerate`).
Every baseline forwards our tokenized requests (`benchmarks.common.task_requests`), so their predictions
are comparable document by document.

Models: a random GPT-NeoX-shaped Hugging Face model (hidden 256, 4 layers, the NeoX vocabulary) for all
engines, and the reference GPT of the same shape for `ours` and `naive`. Figures per (model, task, engine):
tokens forwarded (padding included, counted at the embedding), the minimum (each context once plus every
continuation but its last token, for the pairs that engine scores), wall seconds of one evaluation, extra peak RSS during it,
the baselines' metric update + compute seconds, the baselines' wall and tokens over ours, and how many
documents get the same prediction (argmax of the summed log-likelihood) as ours.

    python -m benchmarks.engines --limit 100 --models neox --tasks hellaswag,piqa,arc_easy --engines ours
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/engines.py`: import `benchmarks` as `-m` would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.common import (
    MAX_LENGTH,
    Scores,
    agreement,
    installed,
    logits_of,
    measured,
    naive_accuracy,
    neox_model,
    our_scores,
    reference_gpt,
    run_twice,
    table_minimum,
    task_requests,
)
from inloop_eval import EvaluatorConfig, InLoopEvaluator
from inloop_eval.data.root import default_data_root, neox_tokenizer_path
from inloop_eval.data.tokenizer import load_tokenizer
from inloop_eval.requests.table import RequestTable
from inloop_eval.tasks import get_task

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
    prep_s: float | None  # a baseline's setup; ours' preparation is inside its first run
    peak_rss_mib: float
    metric_s: float | None  # a baseline's metric update + compute; ours' is inside its wall
    ll: Scores = field(repr=False, default_factory=dict)
    note: str = ""
    first_run_s: float | None = None  # ours: the first run (preparation + one evaluation)

    @property
    def ratio(self) -> float:
        return self.tokens / self.minimum if self.minimum else math.nan


def run_ours(
    model: torch.nn.Module, name: str, task: str, limit: int, tokenizer: Any, data_root: Path, bt: int, pmi: bool
) -> tuple[Run, RequestTable]:
    """Ours on one task, and the task's request table (the baselines forward the same requests)."""
    entry: dict[str, Any] = {"task": task, "limit": limit, "batch_tokens": bt}
    if not pmi:  # the figures the baselines give: no unconditional requests
        entry["metrics"] = [m for m in get_task(task).metrics if m != "acc_pmi"]
    config = EvaluatorConfig(evaluators=[entry], data_root=str(data_root), strict=True)
    evaluator = InLoopEvaluator(config, tokenizer=tokenizer)
    _, m = run_twice(evaluator, model, model)
    result = evaluator.detail(task)
    n_uncond = len(result.uncond_ids) if result is not None else 0
    table = task_requests(task, tokenizer, data_root, limit, with_uncond=n_uncond > 0)
    ll = our_scores(result, table)
    run = Run(
        name, task, "ours", len(np.unique(table.doc_id)), len(table) + n_uncond, int(m["tokens"]),
        table_minimum(table, with_uncond=True), m["wall_s"], None, m["peak_rss_mib"], None, ll,
        note=f"{evaluator.tokens_forwarded} tokens by the evaluator's count; PMI pairs: {n_uncond}",
        first_run_s=m["first_run_s"],
    )
    return run, table


def naive_requests(table: RequestTable, pmi: bool) -> list[tuple[int, int, np.ndarray, int, np.ndarray, bool]]:
    """(doc, cont, row tokens, context length, continuation, is_uncond) per request and, with `pmi`, per
    request's unconditional row (not deduplicated: the OLMo pipeline scores one per request)."""
    out = []
    for r in range(len(table)):
        u = int(table.uncond_id[r])
        for pairs, p, is_uncond in ((table.pairs, r, False), (table.uncond, u, True)):
            if is_uncond and (not pmi or u < 0):
                continue
            ctx, cont = pairs.context(p), pairs.continuation(p)
            row = np.concatenate([ctx, cont[:-1]])
            out.append((int(table.doc_id[r]), int(table.cont_id[r]), row, len(ctx), cont, is_uncond))
    return out


def run_naive(model: torch.nn.Module, name: str, table: RequestTable, rows: int, pmi: bool) -> Run:
    forward = logits_of(model)
    t0 = time.perf_counter()
    requests = naive_requests(table, pmi)
    prep_s = time.perf_counter() - t0
    metric_s = 0.0
    ll: Scores = {}
    uncond: Scores = {}
    with measured(model) as m, torch.inference_mode():
        for start in range(0, len(requests), rows):
            chunk = requests[start : start + rows]
            width = 128 * math.ceil(max(len(q[2]) for q in chunk) / 128)
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, q in enumerate(chunk):
                ids[i, : len(q[2])] = torch.from_numpy(q[2])
            logp_BTV = F.log_softmax(forward(ids).float(), dim=-1)
            t1 = time.perf_counter()
            for i, (doc, cont, _, ctx_len, target, is_uncond) in enumerate(chunk):  # per-request update
                at = torch.arange(ctx_len - 1, ctx_len - 1 + len(target))
                value = float(logp_BTV[i, at, torch.from_numpy(target)].sum())
                (uncond if is_uncond else ll).setdefault((doc, cont), value)
            metric_s += time.perf_counter() - t1
        t1 = time.perf_counter()
        naive_accuracy(table, ll, uncond)
        metric_s += time.perf_counter() - t1
    return Run(
        name, table.task, "naive", len(np.unique(table.doc_id)), len(requests), int(m["tokens"]),
        table_minimum(table, with_uncond=pmi), m["wall_s"], prep_s, m["peak_rss_mib"], metric_s, ll,
    )


def run_olmo_eval(
    model: torch.nn.Module, name: str, table: RequestTable, limit: int, tokenizer_path: Path, rows: int
) -> Run | None:
    from olmo_eval import HFTokenizer, build_task
    from olmo_eval import ICLMetric as OlmoICLMetric

    label = OLMO_LABELS.get(table.task)
    if label is None:
        return None
    t0 = time.perf_counter()
    tokenizer = HFTokenizer(str(tokenizer_path), pad_token_id=1, eos_token_id=0)
    task = build_task(label, tokenizer, model_ctx_len=MAX_LENGTH)
    samples = [s for s in task.samples if s["doc_id"] < limit]
    prep_s = time.perf_counter() - t0
    mismatched = olmo_token_mismatches(samples, table)
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
    return Run(
        name, table.task, "olmo_eval", len({s["doc_id"] for s in samples}), len(samples), int(m["tokens"]),
        table_minimum(table), m["wall_s"], prep_s, m["peak_rss_mib"], metric_s, ll,
        note=f"build_task tokenizes the whole split; requests whose tokens differ from ours: {mismatched}",
    )


def olmo_token_mismatches(samples: list[dict[str, Any]], table: RequestTable) -> int:
    """OLMo's samples whose (query, continuation) tokens are not our request's for the same choice."""
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


def run_lm_eval(model: torch.nn.Module, name: str, table: RequestTable, hf_tokenizer: Any, rows: int) -> Run:
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

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
    return Run(
        name, table.task, "lm_eval", len(np.unique(table.doc_id)), len(table), int(m["tokens"]),
        table_minimum(table), m["wall_s"], prep_s, m["peak_rss_mib"], None, ll,
        note="loglikelihood only (its metric aggregation is not run)",
    )


def hf_tokenizer(path: Path) -> Any:
    import transformers

    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(path), eos_token="<|endoftext|>", pad_token="<|padding|>"
    )


def compare(runs: list[Run]) -> dict[str, Any]:
    """Per baseline: its wall and tokens over ours, and documents whose prediction matches ours."""
    ours = next(r for r in runs if r.engine == "ours")
    return {
        r.engine: {"speedup": r.wall_s / ours.wall_s, "token_ratio": r.tokens / ours.tokens, **agreement(ours.ll, r.ll)}
        for r in runs
        if r is not ours
    }


def print_table(runs: list[Run], comparisons: dict[tuple[str, str], dict[str, Any]]) -> None:
    head = f"{'model':6} {'task':14} {'engine':10} {'docs':>5} {'tokens':>9} {'minimum':>9} {'tok/min':>7} "
    head += f"{'wall s':>7} {'prep s':>7} {'+RSS MiB':>9} {'metric s':>8} {'ours x':>7} {'same pred':>10} {'max|dll|':>9}"
    print(head)
    print("-" * len(head))
    for r in runs:
        c = comparisons[(r.model, r.task)].get(r.engine)
        speed = f"{c['speedup']:.2f}" if c else ""
        same = f"{c['same_predictions']}/{c['documents']}" if c else ""
        diff = f"{c['max_abs_score_diff']:.1e}" if c else ""
        metric = f"{r.metric_s:.3f}" if r.metric_s is not None else "n/a"
        prep = f"{r.prep_s:.2f}" if r.prep_s is not None else "n/a"
        print(
            f"{r.model:6} {r.task:14} {r.engine:10} {r.n_docs:>5} {r.tokens:>9} {r.minimum:>9} {r.ratio:>7.2f} "
            f"{r.wall_s:>7.2f} {prep:>7} {r.peak_rss_mib:>9.0f} {metric:>8} {speed:>7} {same:>10} {diff:>9}"
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


def available_engines(names: list[str]) -> list[str]:
    """The requested engines whose packages are installed; the others are named and skipped."""
    needs = {"olmo_eval": ("olmo_eval",), "lm_eval": ("lm_eval", "accelerate")}
    out = []
    for engine in names:
        missing = [m for m in needs.get(engine, ()) if not installed(m)]
        if missing:
            print(f"{engine}: not installed ({', '.join(missing)}); skipped")
        else:
            out.append(engine)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=200, help="documents per task")
    parser.add_argument("--mmlu-limit", type=int, default=50, help="documents per MMLU task (long prompts)")
    parser.add_argument("--pmi", action="store_true", help="ours and naive also score PMI's requests")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--tasks", default=",".join(DEFAULT_TASKS))
    parser.add_argument("--engines", default="ours,naive,olmo_eval,lm_eval")
    parser.add_argument("--models", default="neox,gpt", help="neox (every engine), gpt (ours and naive)")
    parser.add_argument("--batch-tokens", type=int, default=8192, help="ours: token budget of one forward")
    parser.add_argument("--baseline-rows", type=int, default=16, help="baselines: requests per forward")
    parser.add_argument("--data-root", default=None, help="default: $INLOOP_EVAL_DATA or the cache")
    parser.add_argument("--output", default="bench_engines.json")
    return parser.parse_args(argv)


def run_task(
    args: argparse.Namespace, engines: list[str], model: torch.nn.Module, name: str, task: str, tokenizer: Any
) -> list[Run]:
    """Every engine on one task: ours first, then the baselines on its requests."""
    data_root = Path(args.data_root) if args.data_root else default_data_root()
    tok_path = neox_tokenizer_path(data_root)
    limit = args.mmlu_limit if task.startswith("mmlu") else args.limit
    ours, table = run_ours(model, name, task, limit, tokenizer, data_root, args.batch_tokens, args.pmi)
    runs = [ours]
    rows = args.baseline_rows
    if "naive" in engines:
        runs.append(run_naive(model, name, table, rows, args.pmi))
    if "olmo_eval" in engines and name == "neox":
        run = run_olmo_eval(model, name, table, limit, tok_path, rows)
        runs.extend([run] if run is not None else [])
    if "lm_eval" in engines and name == "neox":
        runs.append(run_lm_eval(model, name, table, hf_tokenizer(tok_path), rows))
    return runs


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    data_root = Path(args.data_root) if args.data_root else default_data_root()
    tokenizer = load_tokenizer(neox_tokenizer_path(data_root))
    engines = available_engines(args.engines.split(","))
    runs: list[Run] = []
    comparisons: dict[tuple[str, str], dict[str, Any]] = {}
    models = {"neox": neox_model, "gpt": reference_gpt}
    for name in args.models.split(","):
        model = models[name]()
        for task in args.tasks.split(","):
            try:
                task_runs = run_task(args, engines, model, name, task, tokenizer)
            except Exception as exc:
                print(f"{name} {task}: failed ({type(exc).__name__}: {exc}); skipped")
                continue
            comparisons[(name, task)] = compare(task_runs)
            runs.extend(task_runs)
            print_table(task_runs, comparisons)
            for engine, c in comparisons[(name, task)].items():
                for doc, margin in c["differing_docs_margin"].items():
                    print(f"  {engine} predicts doc {doc} differently; ours' two choices differ by {margin:.1e} nats")
            print(flush=True)
    print("=" * 40, "all runs")
    print_table(runs, comparisons)
    summary = goal_summary(runs)
    print("\nhellaswag + piqa + arc_easy (neox):", json.dumps(summary))
    report = {
        "args": vars(args),
        "threads": torch.get_num_threads(),
        "runs": [{k: v for k, v in asdict(r).items() if k != "ll"} | {"tokens_over_minimum": r.ratio} for r in runs],
        "comparisons": [{"model": m, "task": t, **c} for (m, t), c in comparisons.items()],
        "goal_tasks": summary,
    }
    Path(args.output).write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
