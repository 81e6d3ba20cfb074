"""What `gpu.py` reports: each label's and the totals' rows per way and evaluation (tokens, seconds, rates,
share of the device's peak, memory, graphs, the kernel that ran, predictions compared), printed and written
as JSON.
"""

from __future__ import annotations

import argparse
import json
import re
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import Scores, agreement
from benchmarks.flash_attention import flash_attn_installed
from benchmarks.olmo_core import LabelRun

WAYS = ("olmo_core", "ours_per_row", "ours_shared")
EVALUATIONS = ("first", "later")
KERNEL_SUMMARY = re.compile(
    r"flex_attention (compiled|eager): (\d+) calls over sequences of \[([^\]]*)\]"
    r"(?:; (\d+) calls ran the dense mask instead)?"
)


def label_rows(label: str, runs: dict[str, LabelRun], evaluations: dict[str, list[dict[str, Any]]],
               env: dict[str, Any]) -> list[dict[str, Any]]:  # fmt: skip
    """One row per way: its evaluations' readings, tokens, rates and predictions compared."""
    rows = []
    for way in WAYS:
        first, later = evaluations[way]
        row: dict[str, Any] = {"label": label, "way": way, "documents": runs[way].n_docs}
        row["tokens"] = runs[way].tokens_at_embedding
        row["first"], row["later"] = first, later
        row.update(rates(row["tokens"], later["wall_s"], env))
        row["kernel"] = kernel_named(way, later, env["flash_kernel"])
        if way != "olmo_core":
            row["same_as_olmo_core"] = same_predictions(runs[way].scores, runs["olmo_core"].scores)
        if way == "ours_shared":
            row["same_as_ours_per_row"] = same_predictions(runs[way].scores, runs["ours_per_row"].scores)
        rows.append(row)
    return rows


def kernel_named(way: str, later: dict[str, Any], flash_kernel: str) -> str:
    """The attention kernel a way's evaluation ran, named with its calls."""
    flash = f"{flash_kernel}: {later['flash_kernel_calls']} calls"
    if way != "ours_shared":
        return flash
    line = later["flex_attention"] or "the engine's attention, dense mask through SDPA (no block rendering)"
    return line if not later["flash_kernel_calls"] else f"{line}; {flash}"


def rates(tokens: int, wall_s: float, env: dict[str, Any]) -> dict[str, Any]:
    """Tokens per second, and on CUDA the share of the device's bfloat16 peak they make."""
    per_s = tokens / wall_s if wall_s else float("nan")
    share = None
    if env["device"].type == "cuda" and env["dtype"] == torch.bfloat16:
        share = 2 * env["parameters"] * per_s / (env["peak_tflops"] * 1e12)
    return {"tokens_per_s": per_s, "bf16_peak_share": share}


def same_predictions(ours: Scores, theirs: Scores) -> dict[str, int]:
    a = agreement(ours, theirs)
    return {"same": a["same_predictions"], "documents": a["documents"], "one_side_only": a["documents_only_one_side"]}


def totals(rows: list[dict[str, Any]], env: dict[str, Any]) -> list[dict[str, Any]]:
    """Each way's sums over the labels (peak memory: the largest), its kernel's calls and lengths, and its
    predictions compared."""
    out = []
    for way in WAYS:
        mine = [r for r in rows if r["way"] == way]
        total: dict[str, Any] = {"label": "all", "way": way, "documents": sum(r["documents"] for r in mine)}
        total["tokens"] = sum(r["tokens"] for r in mine)
        for evaluation in EVALUATIONS:
            each = [r[evaluation] for r in mine]
            peaks = [e["peak_bytes"] for e in each if e["peak_bytes"] is not None]
            total[evaluation] = {
                **{k: sum(e[k] for e in each) for k in ("wall_s", "graphs", "calls_captured", "compile_s")},
                "flash_kernel_calls": sum(e["flash_kernel_calls"] for e in each),
                "peak_bytes": max(peaks) if peaks else None,
                "flex_attention": merged_summaries([e["flex_attention"] for e in each]),
            }
        total.update(rates(total["tokens"], total["later"]["wall_s"], env))
        total["kernel"] = kernel_named(way, total["later"], env["flash_kernel"])
        for key in ("same_as_olmo_core", "same_as_ours_per_row"):
            if mine and key in mine[0]:
                total[key] = {k: sum(r[key][k] for r in mine) for k in ("same", "documents", "one_side_only")}
        out.append(total)
    return out


def merged_summaries(lines: list[str | None]) -> str | None:
    """The FlexAttention summaries of several evaluations as one, in the kernel's own words."""
    parsed = [p for p in map(flex_summary, lines) if p is not None]
    if not parsed:
        return None
    kinds = sorted({"compiled" if p["compiled"] else "eager" for p in parsed})
    lengths = sorted({n for p in parsed for n in p["lengths"]})
    line = f"flex_attention {'/'.join(kinds)}: {sum(p['calls'] for p in parsed)} calls over sequences of {lengths}"
    fallback = sum(p["fallback_calls"] for p in parsed)
    return line + (f"; {fallback} calls ran the dense mask instead" if fallback else "")


def write_report(
    args: argparse.Namespace, env: dict[str, Any], rows: list[dict[str, Any]], fit: dict[str, Any] | None,
    complete: bool = False,
) -> None:  # fmt: skip
    """The JSON report at `--output`: the rows so far, their totals, the fit; `complete` once every label ran."""
    device = env["device"]
    report = {
        "args": vars(args),
        "complete": complete,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "versions": {name: installed_version(name) for name in ("torch", "triton", "flash-attn", "ai2-olmo-core")},
        "model": f"OLMo-core TransformerConfig.{args.config}, {args.dtype}, flash_2, seeded random init",
        "parameters_counted": env["parameters"],
        "flash_kernel": env["flash_kernel"],
        "rows": rows,
        "total": totals(rows, env),
        "attention_tokens_fit": fit,
    }
    Path(args.output).write_text(json.dumps(report, indent=1))


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def print_row(row: dict[str, Any]) -> None:
    first, later = row["first"], row["later"]
    peak = f"{later['peak_bytes'] / 2**30:.2f} GiB" if later["peak_bytes"] is not None else "n/a"
    share = f"{row['bf16_peak_share']:.1%}" if row["bf16_peak_share"] is not None else "n/a"
    same = [f"{row[k]['same']}/{row[k]['documents']}" for k in ("same_as_olmo_core", "same_as_ours_per_row") if k in row]
    print(
        f"{row['label']:40} {row['way']:12} tokens {row['tokens']:>10,} wall {first['wall_s']:>7.2f} s then "
        f"{later['wall_s']:>7.2f} s {row['tokens_per_s']:>9,.0f} tok/s bf16 {share:>6} peak {peak:>9} graphs "
        f"{first['graphs']}+{later['graphs']} (captured {first['calls_captured']}+{later['calls_captured']}, "
        f"compile {first['compile_s']:.1f}+{later['compile_s']:.1f} s) same {' '.join(same) or '-'}"
    )
    print(f"{'':40} {'':12} kernel: {row['kernel']}", flush=True)

def flex_summary(line: str | None) -> dict[str, Any] | None:
    """A FlexAttention kernel's summary line parsed: compiled or eager, calls, sequence lengths, fallbacks."""
    found = KERNEL_SUMMARY.match(line) if line else None
    if found is None:
        return None
    compiled, calls, lengths, fallback = found.groups()
    return {
        "compiled": compiled == "compiled",
        "calls": int(calls),
        "lengths": [int(n) for n in lengths.split(",") if n.strip()],
        "fallback_calls": int(fallback or 0),
    }

def flash_kernel_name(device: torch.device) -> str:
    """The kernel OLMo-core's flash_2 backend runs on `device`: flash-attn's, or the stand-in."""
    if device.type == "cuda" and flash_attn_installed():
        return f"flash-attn {installed_version('flash-attn')} flash_attn_func"
    return "SDPA stand-in for flash_2 (benchmarks/flash_attention.py)"
