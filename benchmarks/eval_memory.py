"""Peak resident memory of one evaluation on CPU: this build against an earlier one, each in a fresh process.

    python -m benchmarks.eval_memory [--baseline c763fb3] [--labels ...] [--limit 30] [--backends flash_2,torch]

The earlier build (`--baseline`, a git revision; default c763fb3, the last before the engine's own attention)
is exported with `git archive` into a temporary folder and imported from there; this build from this
checkout. For each attention backend of the model (OLMo-core's `olmo2_30M`, the NeoX vocabulary padded to
50304, seeded random init, float32) and each build, a fresh Python process:
- builds the model (`flash_2` as on a GPU where none is: `flash_attention.py`; the earlier build calls its
  flash kernel, which there is a stand-in by SDPA) and an `InLoopEvaluator` on `olmo:<label>` for each label
  (`--limit` documents, `--batch-tokens` per forward, OLMo-core's keys);
- runs one evaluation (loading, tokenizing and planning), then measures the second, as every evaluation of
  a training run after its first: the kernel's high-water mark of resident memory (VmHWM) reset just before
  it and read after it, less the memory resident before it.
On `flash_2` the earlier build scores one request per row (it refused packing for a kernel that takes no
mask); this build forwards tree rows and kept prefixes through the engine's attention. On `torch` both
pack. Each line: peak MiB, tokens forwarded, seconds; then this build's peak over the earlier build's, and
the largest difference of any figure between the two builds.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # `python benchmarks/eval_memory.py`: import `benchmarks` as `-m` would
    sys.path.insert(0, str(ROOT))

BASELINE = "c763fb3"
LABELS = ("arc_easy_rc_5shot", "mmlu_stem_mc_5shot", "hellaswag")
VOCAB_SIZE = 50304  # the NeoX vocabulary padded, as OLMo-core's models take it
MAX_LENGTH = 2048


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One build's evaluation in this process (`inloop_eval` imported from `args.build`): its second run's
    peak resident memory above what was resident before it."""
    sys.path.insert(0, args.build)
    import torch
    from olmo_core.nn.transformer import TransformerConfig

    import inloop_eval
    from benchmarks.flash_attention import flash_kernel_stand_in, flash_model_build
    from benchmarks.watch_memory import status_kib
    from inloop_eval import EvaluatorConfig, InLoopEvaluator
    from inloop_eval.data.root import neox_tokenizer_path
    from inloop_eval.data.tokenizer import load_tokenizer

    torch.set_num_threads(args.threads)
    data_root = Path(args.data_root)
    torch.manual_seed(0)
    with flash_model_build():
        config = TransformerConfig.olmo2_30M(vocab_size=VOCAB_SIZE, attn_backend=args.backend)
        model = config.build(init_device="cpu")
    model.init_weights(max_seq_len=MAX_LENGTH, device=torch.device("cpu"))
    model.eval()
    entries = [
        {"task": f"olmo:{label}", "limit": args.limit, "batch_tokens": args.batch_tokens}
        for label in args.labels.split(",")
    ]
    evaluator = InLoopEvaluator(
        EvaluatorConfig(
            evaluators=entries, data_root=str(data_root), strict=True, key_style="olmo_core", max_length=MAX_LENGTH
        ),
        tokenizer=load_tokenizer(neox_tokenizer_path(data_root)),
    )
    with flash_kernel_stand_in():
        t0 = time.perf_counter()
        evaluator.run(model)
        first_s = time.perf_counter() - t0
        gc.collect()
        before = status_kib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts again from here
        t0 = time.perf_counter()
        metrics = evaluator.run(model)
        seconds = time.perf_counter() - t0
        peak = status_kib("VmHWM")
    return {
        "backend": args.backend,
        "build": args.name,
        "imported_from": str(Path(inloop_eval.__file__).parent),
        "peak_mib": (peak - before) / 1024,
        "resident_before_mib": before / 1024,
        "tokens": evaluator.tokens_forwarded,
        "seconds": seconds,
        "first_run_s": first_s,
        "metrics": {k: v for k, v in metrics.items() if isinstance(v, float)},
    }


def export(revision: str, folder: Path) -> Path:
    """The package of `revision` (git archive of `inloop_eval/`) under `folder`."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "inloop_eval"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def in_fresh_process(args: argparse.Namespace, backend: str, name: str, build: Path) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "benchmarks.eval_memory", "--measure", "--backend", backend, "--name", name,
        "--build", str(build), "--labels", args.labels, "--limit", str(args.limit),
        "--batch-tokens", str(args.batch_tokens), "--threads", str(args.threads), "--data-root", args.data_root,
    ]  # fmt: skip
    out = subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def compare(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per backend: this build's peak and tokens over the earlier build's, the largest figure difference."""
    out = {}
    for backend in dict.fromkeys(r["backend"] for r in runs):
        ours, earlier = (next(r for r in runs if r["backend"] == backend and r["build"] == b) for b in ("this", "earlier"))
        shared = set(ours["metrics"]) & set(earlier["metrics"])
        out[backend] = {
            # None where the earlier build's second evaluation took no page beyond what was resident
            "peak_ratio": ours["peak_mib"] / earlier["peak_mib"] if earlier["peak_mib"] > 0 else None,
            "token_ratio": ours["tokens"] / earlier["tokens"],
            "max_figure_diff": max(abs(ours["metrics"][k] - earlier["metrics"][k]) for k in shared),
            "figures_compared": len(shared),
        }
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default=BASELINE, help="the earlier build, a git revision")
    parser.add_argument("--labels", default=",".join(LABELS), help="OLMo labels, comma-separated")
    parser.add_argument("--limit", type=int, default=30, help="documents per label (OLMo's first)")
    parser.add_argument("--backends", default="flash_2,torch", help="the model's attention backends")
    parser.add_argument("--batch-tokens", type=int, default=8192, help="token budget of one forward")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each process")
    parser.add_argument("--data-root", default=None, help="default: $INLOOP_EVAL_DATA or the cache")
    parser.add_argument("--output", default="bench_eval_memory.json")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # one process's run
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--build", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args)))
        return
    if args.data_root is None:  # (a measuring process imports `inloop_eval` only from the build it measures)
        from inloop_eval.data.root import default_data_root

        args.data_root = str(default_data_root())
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        builds = {"earlier": export(args.baseline, Path(tmp)), "this": ROOT}
        for backend in args.backends.split(","):
            for name, build in builds.items():
                run = in_fresh_process(args, backend, name, build)
                runs.append(run)
                print(
                    f"{backend:8} {name:8} peak {run['peak_mib']:8.1f} MiB  tokens {run['tokens']:>8}  "
                    f"{run['seconds']:6.2f} s  (inloop_eval from {run['imported_from']})",
                    flush=True,
                )
    comparison = compare(runs)
    for backend, c in comparison.items():
        peak = "n/a (the earlier build took none)" if c["peak_ratio"] is None else f"{c['peak_ratio']:.2f}x"
        print(f"{backend}: this build's peak {peak} the earlier build's, tokens {c['token_ratio']:.2f}x, "
              f"largest figure difference {c['max_figure_diff']:.1e} over {c['figures_compared']} figures")
    report = {"args": vars(args), "runs": runs, "comparison": comparison}
    Path(args.output).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
