"""Peak resident memory of each rank of a whole `inloop-eval watch --once` (loading and evaluating two
OLMo-core checkpoints) in one process holding the whole model against two ranks under FSDP (`--fsdp`) and
tensor parallel (`--tp 2`), on CPU (gloo):

    python -m benchmarks.watch_memory [--d-model 512] [--layers 4] [--limit 20] [--dir /tmp/watch_memory]

It saves two checkpoints (steps 1 and 2, seeds 1 and 2) of an OLMo 2-shaped OLMo-core Transformer (the block
of `TransformerConfig.olmo2_30M`: reordered norms, QK norm, RoPE theta 500,000; `--d-model`, `--layers`, the
GPT-NeoX vocabulary padded to 50,304; float32) as OLMo-core's checkpointer does (`model_and_optim/` through
`save_model_and_optim_state`, the model config in `config.json`, its `.metadata.json` marker last), from one process, and an evaluator config of
piqa, arc_easy and arc_easy_rc_5shot (`--limit` documents each). Then, in fresh processes per layout (one
process, or two ranks under torchrun):
- `watch`: the watcher's command, `inloop-eval watch DIR --once` (with the layout's `--fsdp` or `--tp 2`),
  run in the process; each rank's peak resident memory is the kernel's high-water mark (VmHWM) at its end;
- `startup`: the same start-up without the watch (torch, OLMo-core's model and checkpoint modules,
  `inloop_eval`'s command, the process group and, in a sharded layout, its device mesh); its VmHWM;
- `imports`: that start-up and torchmetrics, the metrics library every evaluating process imports (the
  in-loop callback's too), with what it imports itself when installed (scipy, matplotlib and, for its BERT
  score, transformers: about 120 MiB resident on the benchmark's machine, the same in every process whatever
  its layout).
A rank's figure is its watch's peak above its layout's import-only (`imports`) peak: what the checkpoints,
the task data (read with pyarrow; the evaluation of these tasks imports no `datasets`, and each rank's JSON
line says so) and the evaluation hold. It prints one JSON line per layout (each rank's MiB, also above
`startup`) and each sharded rank's figure over the one process's, against both; the watcher aims at <= 0.6
above `imports`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/watch_memory.py`: import `benchmarks` as `-m` would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = {"whole": [], "fsdp": ["--fsdp"], "tp2": ["--tp", "2"]}
STEPS = (1, 2)
TASKS = ("piqa", "arc_easy", "arc_easy_rc_5shot")
VOCAB_SIZE = 50304  # the NeoX vocabulary padded, as OLMo-core's models take it
TIMEOUT_S = 900


def model_config(d_model: int, layers: int):  # noqa: ANN201
    """OLMo 2's block (as `TransformerConfig.olmo2_30M` builds it) at this width and depth."""
    from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig

    return TransformerConfig.llama_like(
        d_model=d_model,
        vocab_size=VOCAB_SIZE,
        n_layers=layers,
        n_heads=8,
        block_name=TransformerBlockType.reordered_norm,
        qk_norm=True,
        rope_theta=500_000,
        layer_norm_eps=1e-6,
    )


def save(folder: Path, d_model: int, layers: int) -> int:
    """OLMo-core checkpoints of seeded models of this shape at `<folder>/ckpt/step<N>`; their parameters."""
    from olmo_core.distributed.checkpoint import save_model_and_optim_state
    from olmo_core.train.checkpoint import Checkpointer, CheckpointMetadata

    config = model_config(d_model, layers)
    for step in STEPS:
        torch.manual_seed(step)
        model = config.build(init_device="cpu")
        model.init_weights(device=torch.device("cpu"))
        path = folder / "ckpt" / f"step{step}"
        save_model_and_optim_state(str(path / "model_and_optim"), model)
        (path / "config.json").write_text(json.dumps({"model": config.as_config_dict()}))
        # The checkpointer's completion marker, written last as `Checkpointer._save_metadata` writes it.
        (path / Checkpointer.METADATA_FNAME).write_text(
            json.dumps(CheckpointMetadata().as_dict(json_safe=True))
        )
    return sum(p.numel() for p in model.parameters())


def eval_config(folder: Path, data_root: Path, limit: int) -> Path:
    from inloop_eval.data.root import neox_tokenizer_path

    config = {
        "tokenizer": str(neox_tokenizer_path(data_root)),
        "data_root": str(data_root),
        "max_length": 2048,
        "evaluators": [{"task": task, "limit": limit, "spread": True} for task in TASKS],
    }
    path = folder / "eval.json"
    path.write_text(json.dumps(config))
    return path


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def rank(folder: Path, layout: str, what: str) -> None:
    """One rank of `layout`: the whole watch (`what` "watch"), its start-up alone ("startup") or with the
    evaluation's libraries ("imports"); its VmHWM to `<folder>/results/<layout>/<what>/rank<R>.json`."""
    import olmo_core.distributed.checkpoint  # noqa: F401
    import olmo_core.nn.transformer  # noqa: F401

    from inloop_eval.checkpoints.layout import layout_for
    from inloop_eval.cli.main import main as cli
    from inloop_eval.distributed import init_from_env, world

    options = LAYOUTS[layout]
    if what == "imports":
        import torchmetrics  # noqa: F401
    if what != "watch":
        device = init_from_env()
        sharded = layout_for(int(options[1]) if "--tp" in options else 1, "--fsdp" in options, device)
        if sharded.sharded:
            sharded.mesh()
        status = 0
    else:
        run_dir = folder / "runs" / layout
        args = [
            "watch",
            str(folder / "ckpt"),
            "--config",
            str(folder / "eval.json"),
            "--run-dir",
            str(run_dir),
        ]
        status = cli([*args, "--once", "--settle", "0", "--device", "cpu", *options])
    me = world()[1] if what != "watch" else int(os.environ.get("RANK", 0))
    out = folder / "results" / layout / what
    out.mkdir(parents=True, exist_ok=True)
    hwm_mib = status_kib("VmHWM") / 1024
    (out / f"rank{me}.json").write_text(
        json.dumps({"rank": me, "hwm_mib": hwm_mib, "datasets": "datasets" in sys.modules})
    )
    if status:
        raise SystemExit(f"watch_memory: the watch of layout {layout} exited with {status}")


def measure(folder: Path, layout: str, what: str) -> list[dict]:
    """Each rank's VmHWM (MiB, `hwm_mib`) of `what` in `layout`, each in a fresh process, and whether it
    imported `datasets`."""
    me = ["-m", "benchmarks.watch_memory", "--dir", str(folder), "--rank", layout, what]
    if layout != "whole":
        me = ["-m", "torch.distributed.run", "--nproc_per_node", "2", *me]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, *me], check=True, env=env, cwd=ROOT, timeout=TIMEOUT_S)
    files = sorted((folder / "results" / layout / what).glob("rank*.json"))
    return [json.loads(p.read_text()) for p in files]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--limit", type=int, default=20, help="documents of each task")
    parser.add_argument(
        "--data-root", type=Path, help="task data root (default $INLOOP_EVAL_DATA or the cache)"
    )
    parser.add_argument("--dir", type=Path, default=Path("/tmp/watch_memory"))
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="of whole, fsdp, tp2")
    parser.add_argument("--rank", nargs=2, metavar=("LAYOUT", "WHAT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank(args.dir, *args.rank)
        return
    from inloop_eval.data.root import default_data_root
    from inloop_eval.loggers import METRICS_FILE

    data_root = args.data_root or Path(os.environ.get("INLOOP_EVAL_DATA") or default_data_root()).expanduser()
    args.dir.mkdir(parents=True, exist_ok=True)
    for stale in ("ckpt", "runs", "results"):
        subprocess.run(["rm", "-rf", str(args.dir / stale)], check=True)
    n_params = save(args.dir, args.d_model, args.layers)
    eval_config(args.dir, data_root, args.limit)
    print(json.dumps({"parameters": n_params, "weights_mib": round(n_params * 4 / 2**20, 1)}), flush=True)
    above: dict[str, dict[str, list[float]]] = {"imports": {}, "startup": {}}
    for layout in args.layouts.split(","):
        startup = [r["hwm_mib"] for r in measure(args.dir, layout, "startup")]
        imports = [r["hwm_mib"] for r in measure(args.dir, layout, "imports")]
        watched = measure(args.dir, layout, "watch")
        watch = [r["hwm_mib"] for r in watched]
        above["imports"][layout] = [w - i for w, i in zip(watch, imports, strict=True)]
        above["startup"][layout] = [w - i for w, i in zip(watch, startup, strict=True)]
        ranks = [
            {
                "startup_mib": round(s, 1),
                "imports_mib": round(i, 1),
                "watch_mib": round(w, 1),
                "above_mib": round(w - i, 1),
                "above_startup_mib": round(w - s, 1),
                "imported_datasets": r["datasets"],
            }
            for s, i, w, r in zip(startup, imports, watch, watched, strict=True)
        ]
        print(json.dumps({"layout": layout, "ranks": ranks}), flush=True)
        evaluated = sorted(
            json.loads(line)["step"] for line in (args.dir / "runs" / layout / METRICS_FILE).open()
        )
        if evaluated != list(STEPS):
            raise SystemExit(f"watch_memory: layout {layout} evaluated steps {evaluated}, not {list(STEPS)}")
    if "whole" in above["imports"]:
        print(json.dumps({
            "one_process_above_imports_mib": round(above["imports"]["whole"][0], 1),
            "ratio_per_rank": ratios(above["imports"]),
            "one_process_above_startup_mib": round(above["startup"]["whole"][0], 1),
            "ratio_per_rank_above_startup": ratios(above["startup"]),
        }))  # fmt: skip


def ratios(above: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each sharded layout's ranks over the one process ("whole")."""
    whole = above["whole"][0]
    return {k: [round(v / whole, 3) for v in vs] for k, vs in above.items() if k != "whole"}


if __name__ == "__main__":
    main()
