"""GPU figures, in one command: OLMo-core's own evaluator against ours, one request per row and with shared
prefixes, on a 1B-class OLMo-core model as large runs train it, in one process.

The model: `TransformerConfig.olmo3_1B` (the NeoX vocabulary padded to 50304), seeded random init, bfloat16,
on flash-attention 2, its training backend (where flash-attn or a GPU is missing: built as on one, OLMo-core's
evaluator through a stand-in kernel, `flash_attention.py`). The documents: each label of OLMo-core's `fast`
set (or `--labels`), OLMo's first `--limit` documents, as OLMo-core's evaluator reads them. Per label and in
all, for each way:
- `olmo_core`: OLMo-core 3.0.0's `DownstreamEvaluator`, driven as its callback drives it (`olmo_core.py`);
- `ours_per_row`: `InLoopEvaluator` on a plain logits callable around the model: one request per row, the
  model's own flash kernel;
- `ours_shared`: `InLoopEvaluator` on the model itself: tree rows and kept prefixes, every attention routed
  through the engine's (a FlexAttention block mask on CUDA, `attention_mask: auto`).
Tokens (at the embedding), wall seconds of an evaluation (ours: its second run, as every evaluation of a
training run after the first), tokens per second, peak GPU memory of each way's evaluation (allocated, above
the model's), and the documents each of ours predicts as OLMo-core does. Also the planner's row cost constant
on this device (`attention_tokens`, `engine/prefix_sharing.py`: a row of L tokens costs L x (1 + L / it)),
fitted to the model's forward seconds per token at row lengths 256 to 2048, the engine's attention routed.

    python -m benchmarks.gpu                      # on one GPU, under four minutes
    python -m benchmarks.gpu --device cpu --config olmo2_30M --labels arc_easy_rc_5shot --limit 3   # a check
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/gpu.py`: import `benchmarks` as `-m` would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from benchmarks.common import MAX_LENGTH, agreement
from benchmarks.flash_attention import flash_kernel_stand_in, flash_model_build
from benchmarks.olmo_core import VOCAB_SIZE, LabelRun, TimedForward, run_olmo_core, run_ours
from inloop_eval.data.root import default_data_root, neox_tokenizer_path
from inloop_eval.data.tokenizer import load_tokenizer
from inloop_eval.integrations.olmo_core.callback import task_set_ids
from inloop_eval.tasks import get_task

WAYS = ("olmo_core", "ours_per_row", "ours_shared")


def build_train_module(config_name: str, device: torch.device, batch_tokens: int) -> Any:
    """The seeded model in bfloat16 on flash-attention 2, in an eval-only `TransformerTrainModule` (whose eval
    batch spec OLMo-core's evaluator takes)."""
    from olmo_core.nn.transformer import TransformerConfig
    from olmo_core.optim import AdamWConfig
    from olmo_core.train.train_module import TransformerTrainModule

    torch.manual_seed(0)
    with flash_model_build():
        config = getattr(TransformerConfig, config_name)(vocab_size=VOCAB_SIZE, attn_backend="flash_2")
        model = config.build(init_device=str(device))
    model.init_weights(max_seq_len=MAX_LENGTH, device=device)
    model.to(torch.bfloat16)
    return TransformerTrainModule(
        model,
        AdamWConfig(),
        rank_microbatch_size=batch_tokens,
        max_sequence_length=MAX_LENGTH,
        device=device,
        eval_only=True,
    )


def peak_memory(device: torch.device) -> Any:
    """A callable returning the peak GPU memory allocated since it was made, above what was allocated then
    (None off CUDA)."""
    if device.type != "cuda":
        return lambda: None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)

    def read() -> int:
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base

    return read


def measured_attention_tokens(model: torch.nn.Module, device: torch.device, tokens: int = 16384) -> float:
    """The row length at which attention costs as much as the rest of a forward, on this device: seconds per
    token s(L) of forwards of `tokens` tokens in rows of L (the engine's attention routed, causal), fitted as
    s = a + b L; the constant is a / b."""
    from inloop_eval.engine.tree_attention import causal_tree, mask_rendering
    from inloop_eval.integrations.olmo_core.attention import routed_attention

    lengths, per_token = [256, 512, 1024, 2048], []
    for length in lengths:
        ids = torch.zeros((tokens // length, length), dtype=torch.long, device=device)
        tree = causal_tree(*ids.shape, device, mask_rendering(device))
        with torch.no_grad(), routed_attention(model, tree, tree.position_ids_BT):
            model(ids)  # compiled or warmed for this shape
            sync(device)
            start = time.perf_counter()
            for _ in range(3):
                model(ids)
            sync(device)
        per_token.append((time.perf_counter() - start) / 3 / ids.numel())
    slope, intercept = np.polyfit(lengths, per_token, 1)
    return float(intercept / slope) if slope > 0 else float("inf")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_way(
    way: str, label: str, args: argparse.Namespace, env: dict[str, Any]
) -> tuple[LabelRun, int | None]:
    peak = peak_memory(env["device"])
    with flash_kernel_stand_in():
        if way == "olmo_core":
            run = run_olmo_core(env["train_module"], label, env["tok_path"], env["data_root"], args.limit)
        else:
            run = run_ours(
                env["forward"], label, args.limit, env["tokenizer"], env["data_root"], args.batch_tokens,
                pmi=False, plain_logits=way == "ours_per_row",
            )  # fmt: skip
    return run, peak()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--labels", default="", help="OLMo labels, comma-separated (default: the fast set's)")
    parser.add_argument("--limit", type=int, default=30, help="documents per label (OLMo's first)")
    parser.add_argument("--config", default="olmo3_1B", help="the OLMo-core TransformerConfig constructor")
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--batch-tokens", type=int, default=32768, help="token budget of one forward (all ways)"
    )
    parser.add_argument("--data-root", default=None, help="default: $INLOOP_EVAL_DATA or the cache")
    parser.add_argument("--output", default="bench_gpu.json")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    data_root = Path(args.data_root) if args.data_root else default_data_root()
    labels = [t for t in args.labels.split(",") if t] or [
        t.removeprefix("olmo:") for t in task_set_ids("fast")
    ]
    train_module = build_train_module(args.config, device, args.batch_tokens)
    model = train_module.model.eval()
    with torch.no_grad(), flash_kernel_stand_in():  # first-call costs paid before any way is timed
        model(torch.zeros((1, 128), dtype=torch.long, device=device))
    tok_path = neox_tokenizer_path(data_root)
    env = {
        "device": device, "train_module": train_module, "tok_path": tok_path, "data_root": data_root,
        "tokenizer": load_tokenizer(tok_path), "forward": TimedForward(model),
    }  # fmt: skip
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for label in labels:
        if get_task(f"olmo:{label}").olmo_metric_type == "pmi_dc":
            print(
                f"{label}: pmi_dc; OLMo-core 3.0.0's update_metrics passes no domain-conditional logits; skipped"
            )
            continue
        runs = {}
        for way in WAYS:
            run, peak = run_way(way, label, args, env)
            runs[way] = run
            rows.append(
                {"label": label, "way": way, "tokens": run.tokens, "wall_s": run.wall_s, "peak_bytes": peak}
            )
        for way in WAYS[1:]:
            same = agreement(runs[way].scores, runs["olmo_core"].scores)
            rows[-3 + WAYS.index(way)]["same_predictions"] = f"{same['same_predictions']}/{same['documents']}"
        for row in rows[-3:]:
            print_row(row)
    total = totals(rows)
    print("=" * 40, f"all labels ({time.perf_counter() - t0:.0f} s)")
    for row in total:
        print_row(row)
    attention_tokens = measured_attention_tokens(model, device)
    print(f"attention_tokens on this device: {attention_tokens:,.0f} (the planner's row cost constant)")
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report = {
        "args": vars(args),
        "device": device_name,
        "model": f"{args.config}, bfloat16, flash_2",
        "rows": rows,
        "total": total,
        "attention_tokens": attention_tokens,
    }
    Path(args.output).write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.output}")


def totals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each way's sums over the labels (peak memory: the largest), and its predictions as OLMo-core's."""
    out = []
    for way in WAYS:
        mine = [r for r in rows if r["way"] == way]
        peaks = [r["peak_bytes"] for r in mine if r["peak_bytes"] is not None]
        total = {
            "label": "all", "way": way, "tokens": sum(r["tokens"] for r in mine),
            "wall_s": sum(r["wall_s"] for r in mine), "peak_bytes": max(peaks) if peaks else None,
        }  # fmt: skip
        if way != "olmo_core":
            pairs = [tuple(map(int, r["same_predictions"].split("/"))) for r in mine]
            total["same_predictions"] = f"{sum(s for s, _ in pairs)}/{sum(d for _, d in pairs)}"
        out.append(total)
    return out


def print_row(row: dict[str, Any]) -> None:
    rate = row["tokens"] / row["wall_s"] if row["wall_s"] else float("nan")
    peak = f"{row['peak_bytes'] / 2**30:.2f} GiB" if row["peak_bytes"] is not None else "n/a"
    print(
        f"{row['label']:36} {row['way']:13} tokens {row['tokens']:>10,} wall {row['wall_s']:>7.2f} s "
        f"{rate:>10,.0f} tok/s peak {peak:>10} same as olmo_core {row.get('same_predictions', '-')}"
    )


if __name__ == "__main__":
    main()
