"""Measures, in one command on one GPU, how OLMo-core's own in-loop evaluator and ours (one request per row,
and with shared prefixes) evaluate the same documents on a 1B OLMo-core model in bfloat16: each way is run
twice in one process, and for each evaluation it reports the tokens forwarded, the wall seconds, the tokens per
second, the share of the device's bfloat16 peak, the peak GPU memory above the model, the graphs torch
compiled and the attention kernel that ran, with every document's prediction compared between the ways; it
then fits the planner's row cost constant on this device.

The model: `TransformerConfig.olmo3_1B` (`--config`; the NeoX vocabulary padded to 50304), seeded random init,
bfloat16, on flash-attention 2, its training backend (where flash-attn or a GPU is missing: built as on one,
its kernel a stand-in computing the same causal attention by SDPA, `flash_attention.py`). The documents: for
each label of OLMo-core's `fast` task set (or `--labels`), `--limit` documents spread evenly over its split
(`selected_documents`, the evaluator's `spread: true`), the same ones on every side (OLMo-core's task reads
them through `olmo_core.olmo_eval_reads`). The ways, per label:
- `olmo_core`: OLMo-core 3.0.0's `DownstreamEvaluator`, driven as its callback drives it (`olmo_core.py`),
  the model's flash kernel;
- `ours_per_row`: `InLoopEvaluator` on a plain logits callable around the model: one request per row, the
  model's flash kernel;
- `ours_shared`: `InLoopEvaluator` on the model itself: tree rows and kept prefixes, every attention routed
  through the engine's (on CUDA a FlexAttention block mask, compiled once per sequence length of its ladder;
  `--attention-mask`, `--compile-attention`).
For each way and evaluation (the first, which compiles, and a later one, as every evaluation of a training run
after its first):
- wall seconds (ours' first: preparation too, the loading, tokenizing and planning of its documents;
  OLMo-core's first and later: each a freshly built evaluator's pass, building not counted);
- the kernel that ran: flash-attn's (`flash_attn_func`, where importable and on CUDA) or the SDPA stand-in,
  with its calls; for ours shared the FlexAttention kernel's summary (compiled or eager, calls, the sequence
  lengths of its graphs, calls that ran the dense mask instead), as `InLoopEvaluator.run` logs it;
- graphs compiled and calls captured (torch._dynamo's counters `unique_graphs` and `calls_captured`) and the
  seconds spent compiling (dynamo's `_compile.compile_inner` timer);
- peak GPU memory allocated above what was allocated before it (the model's weights).
For the later evaluation: tokens (at the embedding), tokens per second, and on CUDA the share of the device's
bfloat16 peak (`--peak-tflops`): 2 x parameters (the input embedding's left out: a lookup) x tokens / seconds.
Ours scores the output head only at the positions it reads, so its share counts FLOPs it did not do there.
Predictions (the argmax of OLMo's metric-type score per document): ours per row and ours shared against
OLMo-core's, ours shared against ours per row. Last, the planner's row cost constant on this device
(`attention_tokens`, `inloop_eval/engine/prefix_sharing.py`: a row of L tokens costs L x (1 + L / it)): the
model's forward seconds per token in rows of 256 to 2048 tokens, `--fit-tokens` a forward, its attention
routed through the engine's with the block rendering and a compiled FlexAttention kernel, each shape run once
before it is timed, fitted as a + b L: the constant is a / b. Any call that ran the dense mask instead leaves
it unfitted and the command fails (after writing the report).

Not measured yet (no GPU was lent to this work); estimated from the tokens. Each evaluation of the `fast` set
at `--limit 300` forwards about 5.6 M tokens through OLMo-core's evaluator (one row per request, padded to
multiples of 128), 3.4 M through ours one request per row and 0.7 M through ours shared: 19.5 M for the two
evaluations of the three ways, at 2.4 GFLOP a token on the 1.2 B-parameter model, 2 to 3 minutes of an H200
at 25 to 40% of its bfloat16 peak; then the first shared evaluation's compiles (6 ladder lengths, 1,024 to
32,768) and the CPU's tokenizing and planning (5 minutes on 2 shared cores of a CPU machine): 7 to 10 minutes
in all. At `--limit 150` everything but the compiles halves: 4 to 8 minutes, the command for one H200 below.
The report is rewritten after each label, so a run cut short keeps the labels it finished. The second command
checks the whole path on a CPU machine in about two minutes (float32: bfloat16 matrix products are slow there;
FlexAttention compiled by inductor's CPU template, as on CUDA).

    python -m benchmarks.gpu --limit 150
    python -m benchmarks.gpu --device cpu --config olmo2_30M --dtype float32 --labels arc_easy_rc_5shot \\
        --limit 3 --attention-mask block --compile-attention true --fit-tokens 1024
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

if __package__ in (None, ""):  # `python benchmarks/gpu.py`: import `benchmarks` as `-m` would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from torch._dynamo.utils import compile_times, counters

from benchmarks.common import MAX_LENGTH
from benchmarks.flash_attention import flash_kernel_stand_in, flash_model_build
from benchmarks.gpu_report import (
    EVALUATIONS,
    KERNEL_SUMMARY,
    WAYS,
    flash_kernel_name,
    label_rows,
    print_row,
    totals,
    write_report,
)
from benchmarks.olmo_core import VOCAB_SIZE, LabelRun, TimedForward, run_olmo_core, run_ours
from benchmarks.olmo_documents import selected_documents
from inloop_eval.data.root import default_data_root, neox_tokenizer_path
from inloop_eval.data.tokenizer import load_tokenizer
from inloop_eval.engine.attention_route import Routing, routed
from inloop_eval.engine.flex_kernel import FlexKernel
from inloop_eval.engine.tree_attention import causal_tree
from inloop_eval.integrations.olmo_core.attention import ROUTE
from inloop_eval.integrations.olmo_core.callback import task_set_ids
from inloop_eval.tasks import get_task

# Where `InLoopEvaluator.run` logs its FlexAttention kernel's summary after each evaluation.
ORCHESTRATOR_LOGGER = "inloop_eval.evaluators.orchestrator"
# Row lengths the planner's row cost constant is fitted over.
FIT_LENGTHS = (256, 512, 1024, 2048)


def build_train_module(config_name: str, device: torch.device, batch_tokens: int, dtype: torch.dtype) -> Any:
    """The seeded model in `dtype` on flash-attention 2, in an eval-only `TransformerTrainModule` (whose eval
    batch spec OLMo-core's evaluator takes)."""
    from olmo_core.nn.transformer import TransformerConfig
    from olmo_core.optim import AdamWConfig
    from olmo_core.train.train_module import TransformerTrainModule

    torch.manual_seed(0)
    with flash_model_build():
        config = getattr(TransformerConfig, config_name)(vocab_size=VOCAB_SIZE, attn_backend="flash_2")
        model = config.build(init_device=str(device))
    model.init_weights(max_seq_len=MAX_LENGTH, device=device)
    model.to(dtype)
    return TransformerTrainModule(
        model,
        AdamWConfig(),
        rank_microbatch_size=batch_tokens,
        max_sequence_length=MAX_LENGTH,
        device=device,
        eval_only=True,
    )




class MarkedForward(TimedForward):
    """A `TimedForward` whose `reset`, which `run_twice` calls between ours' first and later evaluation, also
    calls `on_reset`: where the first evaluation's readings are taken."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.on_reset: Callable[[], None] = lambda: None
        super().__init__(model)

    def reset(self) -> None:
        super().reset()
        self.on_reset()


class KernelSummaries(logging.Handler):
    """Keeps the FlexAttention kernel summaries logged to it, in `lines`."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if KERNEL_SUMMARY.match(record.getMessage()):
            self.lines.append(record.getMessage())


class Readings:
    """What ran on the device between two marks: graphs torch._dynamo compiled and calls it captured, seconds
    it spent compiling, peak memory allocated above what was allocated at the earlier mark, calls of OLMo-core's
    flash kernel (while `flash_calls_counted` is open), and the FlexAttention summaries `InLoopEvaluator.run`
    logged."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.flash_calls = 0
        self.summaries = KernelSummaries()
        orchestrator = logging.getLogger(ORCHESTRATOR_LOGGER)
        orchestrator.setLevel(logging.INFO)
        orchestrator.addHandler(self.summaries)
        self.start()

    def start(self) -> None:
        self.graphs = counters["stats"]["unique_graphs"]
        self.captured = counters["stats"]["calls_captured"]
        self.compile_s = compile_seconds()
        self.flash_calls = 0
        self.summaries.lines.clear()
        self.base = 0
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def mark(self) -> dict[str, Any]:
        """The readings since the last mark (or `start`); starts the next."""
        peak = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device) - self.base
        out = {
            "graphs": counters["stats"]["unique_graphs"] - self.graphs,
            "calls_captured": counters["stats"]["calls_captured"] - self.captured,
            "compile_s": compile_seconds() - self.compile_s,
            "peak_bytes": peak,
            "flash_kernel_calls": self.flash_calls,
            # run_ours plans its documents once more after the later evaluation (`PlanOnly`): its summary,
            # of no calls, comes after the evaluation's.
            "flex_attention": self.summaries.lines[0] if self.summaries.lines else None,
        }
        self.start()
        return out

    @contextmanager
    def flash_calls_counted(self) -> Iterator[None]:
        """While open, each call of OLMo-core's flash-attention kernel (flash-attn's or the stand-in in force)
        is counted in `flash_calls`."""
        import olmo_core.nn.attention.backend as backends

        kernel = backends.dispatch_flash_attn

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.flash_calls += 1
            return kernel(*args, **kwargs)

        with mock.patch.object(backends, "dispatch_flash_attn", counted):
            yield


def compile_seconds() -> float:
    """Seconds torch._dynamo has spent compiling in this process (its outermost timer, backends included)."""
    names, values = compile_times(repr="csv", aggregate=True)  # type: ignore[misc]
    return float(dict(zip(names, values, strict=True)).get("_compile.compile_inner", 0.0))



def run_way(
    way: str, label: str, documents: list[int], args: argparse.Namespace, env: dict[str, Any]
) -> tuple[LabelRun, list[dict[str, Any]]]:
    """One way's first and later evaluation of one label: the later run, and each evaluation's readings
    with its wall seconds."""
    readings: Readings = env["readings"]
    forward: MarkedForward = env["forward"]
    evaluations: list[dict[str, Any]] = []
    with flash_kernel_stand_in(), readings.flash_calls_counted():
        readings.start()
        if way == "olmo_core":
            for _ in EVALUATIONS:
                run = run_olmo_core(env["train_module"], label, env["tok_path"], env["data_root"], documents)
                evaluations.append({"wall_s": run.wall_s, **readings.mark()})
        else:
            forward.on_reset = lambda: evaluations.append(readings.mark())
            try:
                run = run_ours(
                    forward, label, args.limit, env["tokenizer"], env["data_root"], args.batch_tokens,
                    pmi=False, plain_logits=way == "ours_per_row", spread=True, settings=env["settings"],
                )  # fmt: skip
            finally:
                forward.on_reset = lambda: None
            evaluations.append(readings.mark())
            evaluations[0]["wall_s"], evaluations[1]["wall_s"] = run.first_run_s, run.wall_s
    if run.n_docs != len(documents):
        raise RuntimeError(f"{label}: {way} scored {run.n_docs} documents, {len(documents)} were selected")
    return run, evaluations


def measured_attention_tokens(model: torch.nn.Module, device: torch.device, tokens: int) -> dict[str, Any]:
    """The row length at which attention costs as much as the rest of a forward, on this device: seconds per
    token s(L) of forwards of `tokens` tokens in plain causal rows of L (FIT_LENGTHS up to `tokens`), attention routed
    through the engine's with the block rendering and a compiled FlexAttention kernel (each shape run once
    before it is timed), fitted as s = a + b L; the constant is a / b. Not fitted (None) where any call ran
    the dense mask instead (`fallback_calls`)."""
    kernel = FlexKernel(compiled=True)
    lengths = [length for length in FIT_LENGTHS if length <= tokens]
    per_token = []
    for length in lengths:
        ids = torch.zeros((tokens // length, length), dtype=torch.long, device=device)
        tree = causal_tree(*ids.shape, device, "block", kernel)
        with torch.no_grad(), routed(model, ROUTE, Routing(tree)):
            model(ids)  # compiled, or warmed, for this shape
            sync(device)
            start = time.perf_counter()
            for _ in range(3):
                model(ids)
            sync(device)
        per_token.append((time.perf_counter() - start) / 3 / ids.numel())
    slope, intercept = np.polyfit(lengths, per_token, 1)
    fitted = float(intercept / slope) if slope > 0 else float("inf")
    return {
        "attention_tokens": fitted if kernel.fallback_calls == 0 else None,
        "seconds_per_token": dict(zip(lengths, per_token, strict=True)),
        "tokens_per_forward": tokens,
        "kernel": kernel.summary(),
        "fallback_calls": kernel.fallback_calls,
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--labels", default="", help="OLMo labels, comma-separated (empty: the labels of OLMo-core's fast set)"
    )
    parser.add_argument(
        "--limit", type=int, default=300, help="documents per label, spread evenly over its split"
    )
    parser.add_argument(
        "--config", default="olmo3_1B", help="the OLMo-core TransformerConfig constructor of the model"
    )
    parser.add_argument("--device", default="cuda", help="the torch device the model and evaluations run on")
    parser.add_argument(
        "--dtype", default="bfloat16", choices=["bfloat16", "float32"],
        help="the model's parameters and activations (float32: a check on CPU, where bfloat16 is slow)",
    )  # fmt: skip
    parser.add_argument(
        "--batch-tokens", type=int, default=32768, help="token budget of one forward, for every way"
    )
    parser.add_argument(
        "--attention-mask", default="auto", choices=["auto", "dense", "block"],
        help="ours shared: how a packed batch's mask is rendered (the config's attention_mask; auto: block "
        "on CUDA, dense elsewhere)",
    )  # fmt: skip
    parser.add_argument(
        "--compile-attention", default="auto", choices=["auto", "true", "false"],
        help="ours shared: whether the block rendering's FlexAttention runs compiled (the config's "
        "compile_attention; auto: on CUDA only)",
    )  # fmt: skip
    parser.add_argument(
        "--peak-tflops", type=float, default=989.0,
        help="the device's dense bfloat16 peak in TFLOP/s, for the share of it reported on CUDA (H100 and "
        "H200 SXM: 989)",
    )  # fmt: skip
    parser.add_argument(
        "--fit-tokens", type=int, default=16384,
        help="tokens of each forward timed to fit the planner's row cost constant, in rows of 256 to 2048 "
        "tokens (as many of them as fit; at least 512; 0: no fit)",
    )  # fmt: skip
    parser.add_argument(
        "--data-root", default=None, help="the task data's folder (None: $INLOOP_EVAL_DATA, else the cache)"
    )
    parser.add_argument("--output", default="bench_gpu.json", help="where the JSON report is written")
    args = parser.parse_args(argv)
    if 0 < args.fit_tokens < FIT_LENGTHS[1]:
        parser.error(f"--fit-tokens: expected 0 or at least {FIT_LENGTHS[1]} (two row lengths to fit), found {args.fit_tokens}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    env = environment(args)
    labels = [t for t in args.labels.split(",") if t] or [t.removeprefix("olmo:") for t in task_set_ids("fast")]
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for label in labels:
        if get_task(f"olmo:{label}").olmo_metric_type == "pmi_dc":
            print(f"{label}: pmi_dc; OLMo-core 3.0.0's update_metrics passes no domain-conditional logits; skipped")
            continue
        documents = selected_documents(label, env["data_root"], args.limit, spread=True)
        runs, evaluations = {}, {}
        for way in WAYS:
            runs[way], evaluations[way] = run_way(way, label, documents, args, env)
        rows.extend(label_rows(label, runs, evaluations, env))
        for row in rows[-len(WAYS) :]:
            print_row(row)
        write_report(args, env, rows, None)  # each label's figures kept, should the run be cut short
    print("=" * 40, f"all labels ({time.perf_counter() - t0:.0f} s)")
    for row in totals(rows, env):
        print_row(row)
    fit = None
    if args.fit_tokens:
        fit = measured_attention_tokens(env["model"], env["device"], args.fit_tokens)
        print(
            f"attention_tokens on this device: {fit['attention_tokens'] or 'not fitted'} (the planner's row cost "
            f"constant, ATTENTION_COST_TOKENS_BY_DEVICE[{env['device'].type!r}]); {fit['kernel']}"
        )
    write_report(args, env, rows, fit, complete=True)
    print(f"\nwrote {args.output}")
    if fit is not None and fit["fallback_calls"]:
        raise SystemExit(f"attention_tokens not fitted: {fit['fallback_calls']} calls ran the dense mask ({fit['kernel']})")


def environment(args: argparse.Namespace) -> dict[str, Any]:
    """The model (its first-call costs paid), the tokenizer and data, the readings, and what every way
    shares."""
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    data_root = Path(args.data_root) if args.data_root else default_data_root()
    train_module = build_train_module(args.config, device, args.batch_tokens, dtype)
    model = train_module.model.eval()
    with torch.no_grad(), flash_kernel_stand_in():
        model(torch.zeros((1, 128), dtype=torch.long, device=device))
    tok_path = neox_tokenizer_path(data_root)
    compile_attention = {"auto": None, "true": True, "false": False}[args.compile_attention]
    return {
        "device": device, "dtype": dtype, "train_module": train_module, "model": model, "tok_path": tok_path,
        "data_root": data_root, "tokenizer": load_tokenizer(tok_path), "forward": MarkedForward(model),
        "readings": Readings(device),
        "settings": {"attention_mask": args.attention_mask, "compile_attention": compile_attention},
        "parameters": sum(p.numel() for p in model.parameters()) - model.embeddings.weight.numel(),
        "peak_tflops": args.peak_tflops, "flash_kernel": flash_kernel_name(device),
    }  # fmt: skip


if __name__ == "__main__":
    main()
