"""Shared prefixes against today's rows: the same evaluator with `share_prefixes` on and off, in one process.

    python -m benchmarks.prefix_sharing --task-set fast --limit 300 --wall-limit 50 --threads 2
    python -m benchmarks.prefix_sharing --task-set fast --limit 0 --wall-limit 100 --spread --repeats 3

Tokens: for each label (OLMo-core's task set `--task-set`, and any `--labels`), its first `--limit` documents
planned for a model that takes packed rows (`PlanOnly`: no forward is computed) three ways: today's rows
(each context shared by its own continuations), tree rows (one prefix trie), and tree rows below kept
prefixes (a model with `prefix_reuse`), against the per-document minimum (each distinct context once plus every continuation but its last
token) and the trie minimum (every distinct prefix of the requests' own rows once; the least any sharing can
forward). Both minima are counted here from the requests, not by the package.
Wall: one evaluation of every label's first `--wall-limit` documents with the reference GPT (`--width`, 256,
and `--layers`, 4, by default; packed rows, kept prefixes), as a training run sees it from its second
evaluation on, each way: wall seconds, extra peak RSS, tokens at the embedding, and every document's
prediction compared. The two ways run in turn `--repeats` times after a first (untimed) run each; the
least wall seconds of each way are compared (the machine's other load only ever adds time).
`--spread` takes each label's documents evenly spaced over its split instead of its first ones (the
evaluator's `spread`): a sample of the whole evaluation, where the first documents are a few subjects
(MMLU humanities opens with its longest passages).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    MAX_LENGTH,
    PlanOnly,
    agreement,
    measured,
    our_scores,
    reference_gpt,
    table_minimum,
    table_rows,
    task_requests,
    trie_minimum,
)
from inloop_eval import EvaluatorConfig, InLoopEvaluator
from inloop_eval.data.root import default_data_root, neox_tokenizer_path
from inloop_eval.data.tokenizer import load_tokenizer
from inloop_eval.engine.prefix_sharing import ATTENTION_COST_TOKENS_BY_DEVICE
from inloop_eval.integrations.olmo_core.callback import task_set_ids

VOCAB_SIZE = 50304
BATCH_TOKENS = 8192


def evaluator(
    task_ids: list[str],
    limit: int,
    data_root: Path,
    tokenizer: Any,
    share: bool,
    attention_tokens: int | None = None,
    spread: bool = False,
) -> InLoopEvaluator:
    entries = [{"task": t, "limit": limit, "spread": spread, "batch_tokens": BATCH_TOKENS} for t in task_ids]
    config = EvaluatorConfig(
        evaluators=entries,
        data_root=str(data_root),
        strict=True,
        max_length=MAX_LENGTH,
        share_prefixes=share,
        attention_tokens=attention_tokens,
    )
    return InLoopEvaluator(config, tokenizer=tokenizer)


def token_rows(
    task_ids: list[str],
    limit: int,
    data_root: Path,
    tokenizer: Any,
    attention_tokens: int | None,
    spread: bool,
) -> list[dict[str, Any]]:
    """Per label: tokens planned each way and the two minima of the requests the evaluator scored; for the
    shared way, and the shared way planned with CUDA's row cost constant (`cuda`), the sequence lengths the
    block rendering arranges its batches in (`lengths`: one compiled graph each) and the keys they hold."""
    rows = []
    cuda_tokens = ATTENTION_COST_TOKENS_BY_DEVICE["cuda"]
    ways = (("today", False, False, attention_tokens), ("tree", True, False, attention_tokens),
            ("shared", True, True, attention_tokens), ("cuda", True, True, cuda_tokens))  # fmt: skip
    for task_id in task_ids:
        planned: dict[str, Any] = {}
        for name, share, keep, constant in ways:
            ev = evaluator([task_id], limit, data_root, tokenizer, share, constant, spread)
            model = PlanOnly(VOCAB_SIZE, MAX_LENGTH, prefix_reuse=keep)
            ev.run(model)
            planned[name] = ev.tokens_forwarded
            if keep:
                planned[f"{name}_lengths"] = sorted({length for length, _ in model.lengths})
                planned[f"{name}_arranged"] = sum(length for length, _ in model.lengths)
                planned[f"{name}_keys"] = sum(keys for _, keys in model.lengths)
        with_uncond = len(ev.detail(task_id).uncond_ids) > 0
        table = task_requests(task_id, tokenizer, data_root, limit, with_uncond=with_uncond, spread=spread)
        trie = trie_minimum(table_rows(table, with_uncond=with_uncond))
        rows.append(
            {
                "label": task_id.removeprefix("olmo:"),
                "per_document_minimum": table_minimum(table, with_uncond=with_uncond),
                "trie_minimum": trie,
                **planned,
            }
        )
        r = rows[-1]
        print(
            f"{r['label']:42} per-doc min {r['per_document_minimum']:>9,} trie min {trie:>9,} today "
            f"{r['today']:>9,} tree {r['tree']:>9,} kept {r['shared']:>9,}  tree/trie {r['tree'] / trie:.2f}  "
            f"kept/trie {r['shared'] / trie:.2f}  today/kept {r['today'] / r['shared']:.2f}  "
            f"cuda plan {r['cuda']:>9,} lengths {r['cuda_lengths']}",
            flush=True,
        )
    return rows


def wall_comparison(
    task_ids: list[str],
    limit: int,
    data_root: Path,
    tokenizer: Any,
    attention_tokens: int | None,
    model_shape: tuple[int, int] = (256, 4),
    spread: bool = False,
    repeats: int = 1,
) -> dict[str, Any]:
    """Evaluations of every label each way on the reference GPT (`model_shape`: width, layers): a first run
    each (loading, tokenizing, planning), then `repeats` timed runs of each in turn; the least wall seconds
    and the largest extra peak RSS of each way, and their predictions compared."""
    model = reference_gpt(*model_shape)
    ways = {
        name: evaluator(task_ids, limit, data_root, tokenizer, share, attention_tokens, spread)
        for name, share in (("today", False), ("shared", True))
    }
    for ev in ways.values():
        ev.run(model)
    out: dict[str, Any] = {name: {"runs_s": []} for name in ways}
    for _ in range(repeats):
        for name, ev in ways.items():
            with measured(model) as m:
                ev.run(model)
            o = out[name]
            o["runs_s"].append(round(m["wall_s"], 2))
            o["tokens"] = m["tokens"]
            o["peak_rss_mib"] = max(o.get("peak_rss_mib", 0.0), m["peak_rss_mib"])
    scores: dict[str, dict[str, Any]] = {}
    for name, ev in ways.items():
        out[name]["wall_s"] = min(out[name]["runs_s"])
        scores[name] = {}
        for task_id in task_ids:
            result = ev.detail(task_id)
            with_uncond = len(result.uncond_ids) > 0
            table = task_requests(
                task_id, tokenizer, data_root, limit, with_uncond=with_uncond, spread=spread
            )
            scores[name][task_id] = our_scores(result, table)
    same = [agreement(scores["shared"][t], scores["today"][t]) for t in task_ids]
    out["same_predictions"] = sum(a["same_predictions"] for a in same)
    out["documents"] = sum(a["documents"] for a in same)
    out["max_abs_score_diff"] = max(a["max_abs_score_diff"] for a in same)
    out["speedup"] = out["today"]["wall_s"] / out["shared"]["wall_s"]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--task-set", default="fast", help="OLMo-core's task set (fast, full, ...); '' for none"
    )
    parser.add_argument(
        "--labels", default="", help="more task ids, comma-separated (e.g. olmo:piqa_val_rc_5shot)"
    )
    parser.add_argument(
        "--limit", type=int, default=300, help="documents per label for the token counts (0: none)"
    )
    parser.add_argument(
        "--wall-limit", type=int, default=50, help="documents per label for the timed run (0: none)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--width", type=int, default=256, help="the timed reference GPT's width")
    parser.add_argument("--layers", type=int, default=4, help="the timed reference GPT's layers")
    parser.add_argument(
        "--attention-tokens", type=int, help="the row cost model's constant (default: the device's)"
    )
    parser.add_argument(
        "--spread", action="store_true", help="documents evenly spaced over each split, not its first"
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="timed runs of each way, in turn (the least counts)"
    )
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data_root = default_data_root()
    tokenizer = load_tokenizer(neox_tokenizer_path(data_root))
    named = (task_set_ids(args.task_set) if args.task_set else []) + [t for t in args.labels.split(",") if t]
    task_ids = list(dict.fromkeys(named))  # each label once
    report: dict[str, Any] = {"limit": args.limit, "spread": args.spread}
    if args.limit:
        rows = token_rows(task_ids, args.limit, data_root, tokenizer, args.attention_tokens, args.spread)
        totals: dict[str, Any] = {
            k: sum(r[k] for r in rows)
            for k in ("per_document_minimum", "trie_minimum", "today", "tree", "shared", "cuda")
            + ("shared_arranged", "shared_keys", "cuda_arranged", "cuda_keys")
        }
        for way in ("shared", "cuda"):
            totals[f"{way}_lengths"] = sorted(set().union(*(r[f"{way}_lengths"] for r in rows)))
        print(
            f"all {len(rows)} labels: per-doc min {totals['per_document_minimum']:,} trie min "
            f"{totals['trie_minimum']:,} today {totals['today']:,} tree {totals['tree']:,} kept "
            f"{totals['shared']:,}  tree/trie {totals['tree'] / totals['trie_minimum']:.2f}  kept/trie "
            f"{totals['shared'] / totals['trie_minimum']:.2f}  today/kept {totals['today'] / totals['shared']:.2f}"
        )
        for way, constant in (("shared", args.attention_tokens or "the CPU's"), ("cuda", "CUDA's")):
            print(
                f"block rendering, planned with {constant} row cost constant: {totals[way]:,} tokens "
                f"({totals[way] / totals['trie_minimum']:.2f}x the trie minimum), compiled graphs "
                f"{len(totals[f'{way}_lengths'])} (sequence lengths {totals[f'{way}_lengths']}), keys arranged "
                f"{totals[f'{way}_arranged'] / totals[f'{way}_keys']:.2f}x the keys held"
            )
        report.update(labels=rows, totals=totals)
    if args.wall_limit:
        shape = (args.width, args.layers)
        report["wall"] = wall_comparison(
            task_ids,
            args.wall_limit,
            data_root,
            tokenizer,
            args.attention_tokens,
            shape,
            args.spread,
            args.repeats,
        )
        w = report["wall"]
        print(
            f"wall ({args.wall_limit} documents a label, reference GPT {args.width} x {args.layers}): today {w['today']['wall_s']:.1f} s "
            f"{w['today']['tokens']:,} tokens {w['today']['peak_rss_mib']:.0f} MiB; shared "
            f"{w['shared']['wall_s']:.1f} s {w['shared']['tokens']:,} tokens {w['shared']['peak_rss_mib']:.0f} MiB; "
            f"{w['speedup']:.2f}x; same predictions {w['same_predictions']}/{w['documents']}, largest score "
            f"difference {w['max_abs_score_diff']:.2e}; runs today {w['today']['runs_s']} shared {w['shared']['runs_s']}"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
