"""The output head's arithmetic alone: log p(target) and greedy flags from float32 logits, this build's
`plain_logprobs` against the two-pass computation it replaced (written out here: the max, the full argmax of
every row whose target reaches it, then the log-sum-exp), in one process, on the same logits.

Each batch reads `--positions` positions over `--vocab` token ids, in chunks of `chunk_positions(vocab)`
positions as the engine cuts them (every chunk timed full), with `--targets` targets a position (the last
context position of a letter-key document predicts every choice). Two kinds of logits: `ties`, every logit
equal (an untrained or zeroed head, and `PlanOnly`, the planning benchmarks' model: every target reaches its
row's maximum, the two-pass computation's worst case), and `random` (normal logits, the first target of each
position its argmax). Each chunk's logits are copied into a scratch buffer first, as the head's projection
writes them, and scored in place; the copy is timed on both sides. Seconds: the least of `--repeats` runs of
`--batches` batches. Both sides must give the same flags and the same log-probabilities, bit for bit.

    python -m benchmarks.head [--vocab 100278] [--positions 320] [--targets 4] [--batches 10] [--threads 1]

`--evaluation` measures the head where a training run meets it instead: one evaluation of OLMo-core's `fast`
set (or `--labels`), `--limit` documents a label spread over each split, through `PlanOnly` (the planning
benchmarks' model: packed rows, kept prefixes, every logit equal), by this build and by an earlier one
(`--baseline`, a git revision; default 7c73188, the last before `row_max`). Each build runs in a fresh
process that imports it alone: the earlier build's `inloop_eval` and `benchmarks` (its `PlanOnly` and its
evaluator, as `eval_memory.export` exports a package) are exported with `git archive` into a temporary
folder, this file is copied beside them to drive the run, and the process starts in that folder (this build's
in this checkout) and checks that it imported `inloop_eval` and `benchmarks.common` from there. The first
evaluation (loading, tokenizing, planning) is not timed; the second, as a training run sees every
evaluation after its first, is. Printed and written: wall seconds of each, the earlier build's over this
build's, tokens forwarded (equal, or the run fails) and the largest difference of any figure of the
evaluator's metrics (every key the same and within 1e-9, or the run fails).

    python -m benchmarks.head --evaluation [--limit 300] [--threads 1] [--baseline 7c73188] [--labels ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # `python benchmarks/head.py`: import `benchmarks` as `-m` would
    sys.path.insert(0, str(ROOT))

import torch
from torch import Tensor

import inloop_eval
from benchmarks import common
from benchmarks.common import MAX_LENGTH, PlanOnly
from benchmarks.eval_memory import export
from benchmarks.prefix_sharing import VOCAB_SIZE, evaluator
from inloop_eval.data.root import default_data_root, neox_tokenizer_path
from inloop_eval.data.tokenizer import load_tokenizer
from inloop_eval.engine.logprobs import chunk_positions, plain_logprobs
from inloop_eval.integrations.olmo_core.callback import task_set_ids

BASELINE = "7c73188"  # the commit before `row_max`
TASK_SET = "fast"
FIGURE_TOLERANCE = 1e-9

# Scores one chunk: logits [C, V] (scratch, may be overwritten), the targets' positions [M] and ids [M].
Scorer = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def two_pass(logits_CV: Tensor, local_M: Tensor, target_M: Tensor) -> tuple[Tensor, Tensor]:
    """The computation `plain_logprobs` replaced: the max, the argmax of the rows of targets that reach it
    (one copy and one read of each such target's row), then the log-sum-exp in place."""
    logit_M = logits_CV[local_M, target_M]
    max_C = logits_CV.amax(dim=-1)
    greedy_M = logit_M >= max_C[local_M]
    candidates = torch.nonzero(greedy_M)[:, 0]
    if candidates.numel():
        greedy_M[candidates] = logits_CV[local_M[candidates]].argmax(dim=-1) == target_M[candidates]
    shift_C = torch.where(torch.isfinite(max_C), max_C, torch.zeros_like(max_C))
    logsumexp_C = logits_CV.sub_(shift_C[:, None]).exp_().sum(dim=-1).log_().add_(shift_C)
    return logit_M - logsumexp_C[local_M], greedy_M


def this_build(logits_CV: Tensor, local_M: Tensor, target_M: Tensor) -> tuple[Tensor, Tensor]:
    return plain_logprobs(logits_CV, local_M, target_M, in_place=True)


SIDES: dict[str, Scorer] = {"two_pass": two_pass, "this_build": this_build}


def chunk_logits(kind: str, rows: int, vocab: int) -> Tensor:
    """One chunk's logits [C, V] of `kind` (`ties` or `random`), seeded."""
    if kind == "ties":
        return torch.zeros(rows, vocab)
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0))


def chunk_targets(logits_CV: Tensor, per_position: int) -> tuple[Tensor, Tensor]:
    """`per_position` targets a position [M]: its argmax first, then seeded random ids."""
    rows, vocab = logits_CV.shape
    local_M = torch.arange(rows).repeat_interleave(per_position)
    others = torch.randint(0, vocab, (rows, per_position - 1), generator=torch.Generator().manual_seed(1))
    return local_M, torch.cat([logits_CV.argmax(dim=-1)[:, None], others], dim=1).reshape(-1)


def run(
    score: Scorer, logits_CV: Tensor, targets: tuple[Tensor, Tensor], n_chunks: int
) -> tuple[float, Tensor, Tensor]:
    """Seconds to score `n_chunks` chunks (each copied into scratch first), and the last chunk's scores."""
    scratch_CV = torch.empty_like(logits_CV)
    start = time.perf_counter()
    for _ in range(n_chunks):
        logp_M, greedy_M = score(scratch_CV.copy_(logits_CV), *targets)
    return time.perf_counter() - start, logp_M, greedy_M


def compare(kind: str, args: argparse.Namespace) -> dict[str, object]:
    """Both sides on one kind of logits: least seconds of each over the repeats, in turn, and the check that
    they agree."""
    rows = min(chunk_positions(args.vocab), args.positions)
    n_chunks = args.batches * -(-args.positions // rows)
    logits_CV = chunk_logits(kind, rows, args.vocab)
    targets = chunk_targets(logits_CV, args.targets)
    seconds: dict[str, list[float]] = {name: [] for name in SIDES}
    for _ in range(args.repeats):
        found: dict[str, tuple[Tensor, Tensor]] = {}
        for name, score in SIDES.items():
            s, logp_M, greedy_M = run(score, logits_CV, targets, n_chunks)
            seconds[name].append(s)
            found[name] = (logp_M, greedy_M)
        if not all(torch.equal(a, b) for a, b in zip(found["two_pass"], found["this_build"], strict=True)):
            raise SystemExit(f"{kind}: this build's scores differ from the two-pass computation's")
    best = {name: min(s) for name, s in seconds.items()}
    return {
        "kind": kind,
        "chunk_positions": rows,
        "chunks": n_chunks,
        "targets_per_chunk": int(targets[0].shape[0]),
        "greedy_targets": int(found["this_build"][1].sum()),
        "two_pass_s": round(best["two_pass"], 4),
        "this_build_s": round(best["this_build"], 4),
        "ratio": round(best["two_pass"] / best["this_build"], 2),
        "same_scores": True,
    }


def export_build(revision: str, folder: Path) -> Path:
    """`revision`'s `inloop_eval` and `benchmarks` under `folder`, with this file as `benchmarks/head.py` to
    drive its run."""
    export(revision, folder)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "benchmarks"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    shutil.copyfile(Path(__file__), folder / "benchmarks" / "head.py")
    return folder


def check_imported_from(build: Path) -> None:
    """Fail unless this process imported the package and the benchmarks' models from `build`."""
    for module in (inloop_eval, common):
        found = Path(module.__file__).resolve()
        if not found.is_relative_to(build.resolve()):
            raise SystemExit(
                f"--build {build}: {module.__name__} was imported from {found}; start the process in the build's "
                "folder so that it comes first on sys.path"
            )


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """One build's evaluation in this process: seconds of its second run, tokens forwarded and figures."""
    check_imported_from(Path(args.build))
    torch.set_num_threads(args.threads)
    data_root = Path(args.data_root)
    tokenizer = load_tokenizer(neox_tokenizer_path(data_root))
    ev = evaluator(args.tasks.split(","), args.limit, data_root, tokenizer, share=True, spread=True)
    model = PlanOnly(VOCAB_SIZE, MAX_LENGTH, prefix_reuse=True)
    start = time.perf_counter()
    ev.run(model)
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    metrics = ev.run(model)
    seconds = time.perf_counter() - start
    return {
        "build": args.name,
        "imported_from": str(Path(inloop_eval.__file__).parent),
        "seconds": seconds,
        "first_run_s": first_s,
        "tokens": ev.tokens_forwarded,
        "metrics": metrics,
    }


def in_fresh_process(args: argparse.Namespace, name: str, build: Path, tasks: list[str]) -> dict[str, Any]:
    """`evaluate` in a new Python process started in `build` (first on its sys.path under `-m`)."""
    command = [
        sys.executable, "-m", "benchmarks.head", "--measure-evaluation", "--name", name, "--build", str(build),
        "--tasks", ",".join(tasks), "--limit", str(args.limit), "--threads", str(args.threads),
        "--data-root", args.data_root,
    ]  # fmt: skip
    proc = subprocess.run(command, cwd=build, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the {name} build's process failed ({proc.returncode}):\n{proc.stderr[-5000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def figure_difference(found: dict[str, float], expected: dict[str, float]) -> float:
    """The largest absolute difference of any figure (NaN equal to NaN); infinite if the keys differ."""
    if found.keys() != expected.keys():
        return math.inf
    pairs = [(found[key], expected[key]) for key in found]
    return max((0.0 if math.isnan(a) and math.isnan(b) else abs(a - b) for a, b in pairs), default=0.0)


def compare_builds(args: argparse.Namespace) -> dict[str, Any]:
    """Both builds' evaluations, each in its own process, and the check that they forward and report the same."""
    args.data_root = args.data_root or str(default_data_root())
    tasks = [f"olmo:{label}" for label in args.labels.split(",")] if args.labels else task_set_ids(TASK_SET)
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in (("baseline", export_build(args.baseline, Path(tmp))), ("this", ROOT)):
            runs[name] = run = in_fresh_process(args, name, build, tasks)
            print(
                f"{name:8} {run['seconds']:8.2f} s (first run {run['first_run_s']:.2f} s)  tokens {run['tokens']:>11,}"
                f"  (inloop_eval from {run['imported_from']})",
                flush=True,
            )
    baseline, this = runs["baseline"], runs["this"]
    diff = figure_difference(this["metrics"], baseline["metrics"])
    return {
        "baseline": args.baseline,
        "tasks": tasks,
        "limit": args.limit,
        "threads": args.threads,
        "load_average": os.getloadavg(),
        "runs": runs,
        "ratio": baseline["seconds"] / this["seconds"],
        "same_tokens": this["tokens"] == baseline["tokens"],
        "figures_compared": len(this["metrics"]),
        "max_figure_diff": diff,
        "same_figures": diff <= FIGURE_TOLERANCE,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--vocab", type=int, default=100278, help="logits' width (default: OLMo 2's vocabulary)"
    )
    parser.add_argument("--positions", type=int, default=320, help="positions read a batch")
    parser.add_argument("--targets", type=int, default=4, help="targets a position")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kinds", default="ties,random", help="logits scored: ties, random, comma-separated")
    parser.add_argument("--output", default=None, help="write the figures as JSON here")
    parser.add_argument(
        "--evaluation", action="store_true", help="time a PlanOnly evaluation against --baseline"
    )
    parser.add_argument("--baseline", default=BASELINE, help="--evaluation's earlier build, a git revision")
    parser.add_argument("--limit", type=int, default=300, help="--evaluation's documents a label, spread")
    parser.add_argument(
        "--labels", default=None, help=f"--evaluation's OLMo labels (default: the {TASK_SET} set)"
    )
    parser.add_argument("--data-root", default=None, help="default: $INLOOP_EVAL_DATA or the cache")
    # One build's run, in the process `--evaluation` starts for it:
    parser.add_argument("--measure-evaluation", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--build", help=argparse.SUPPRESS)
    parser.add_argument("--tasks", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def evaluation_main(args: argparse.Namespace) -> None:
    """`--evaluation`: print and write both builds' figures; fail if tokens or figures differ."""
    report = compare_builds(args)
    print(
        f"this build {report['ratio']:.2f}x faster than {args.baseline}; tokens "
        f"{'equal' if report['same_tokens'] else 'DIFFER'}; largest figure difference {report['max_figure_diff']:.1e} "
        f"over {report['figures_compared']} figures",
        flush=True,
    )
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=1) + "\n")
    if not (report["same_tokens"] and report["same_figures"]):
        raise SystemExit(f"this build and {args.baseline} differ in tokens forwarded or in figures")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.measure_evaluation:
        print(json.dumps(evaluate(args)))
        return
    if args.evaluation:
        evaluation_main(args)
        return
    torch.set_num_threads(args.threads)
    results = []
    for kind in args.kinds.split(","):
        results.append(compare(kind, args))
        r = results[-1]
        print(
            f"{kind:7} {r['chunks']} chunks of {r['chunk_positions']} x {args.vocab} float32, "
            f"{r['targets_per_chunk']} targets each ({r['greedy_targets']} greedy): two-pass "
            f"{r['two_pass_s']:.3f} s, this build {r['this_build_s']:.3f} s, ratio {r['ratio']:.2f}x, "
            "same scores",
            flush=True,
        )
    report = {
        "vocab": args.vocab,
        "positions": args.positions,
        "targets": args.targets,
        "batches": args.batches,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "kinds": results,
    }
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
