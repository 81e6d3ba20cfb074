"""Peak resident memory each rank of the watcher takes to load one OLMo-core checkpoint: one process holding the
whole model (the watcher without a layout) against two ranks under FSDP (`--fsdp`) and tensor parallel
(`--tp 2`), on CPU (gloo):

    python -m benchmarks.watch_memory [--d-model 512] [--layers 8] [--dir /tmp/watch_memory]

It saves an `olmo2`-shaped OLMo-core Transformer (`--d-model`, `--layers`, the GPT-NeoX vocabulary of 50,304;
float32) as OLMo-core's checkpointer does (`model_and_optim/` through `save_model_and_optim_state`, the model
config in `config.json`) from one process, then loads it as `inloop-eval watch` does
(`inloop_eval.watch.loading.load_model`) in a fresh process per layout: one process, then two ranks under
torchrun for each sharded layout. Each rank measures the peak resident memory of the load alone: the kernel's
high-water mark (VmHWM) reset after start-up (imports of OLMo-core, process group, device mesh), read after
the load, less the memory resident before it. It prints one JSON line per layout (each rank's MiB, the bytes it read) and the ratio of
each sharded rank's peak to the one process's; the watcher aims at <= 0.6.
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
import torch.distributed as dist

LAYOUTS = {"whole": [], "fsdp": ["--fsdp"], "tp2": ["--tp", "2"]}


def model_config(d_model: int, layers: int):  # noqa: ANN201
    from olmo_core.nn.transformer import TransformerConfig

    return TransformerConfig.llama_like(d_model=d_model, vocab_size=50304, n_layers=layers, n_heads=8)


def save(folder: Path, d_model: int, layers: int) -> None:
    """An OLMo-core checkpoint of a seeded model of this shape at `<folder>/step0`."""
    from olmo_core.distributed.checkpoint import save_model_and_optim_state

    config = model_config(d_model, layers)
    torch.manual_seed(0)
    model = config.build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    step = folder / "step0"
    save_model_and_optim_state(str(step / "model_and_optim"), model)
    (step / "config.json").write_text(json.dumps({"model": config.as_config_dict()}))


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def load(folder: Path, tp: int, fsdp: bool, out: Path) -> None:
    """One rank's load of `<folder>/step0` in the layout; its peak resident memory of the load to `out`."""
    from inloop_eval.distributed import init_from_env, world
    from inloop_eval.watch.discovery import Checkpoint
    from inloop_eval.watch.layout import layout_for
    from inloop_eval.watch.loading import load_model

    device = init_from_env()
    layout = layout_for(tp, fsdp, device)
    checkpoint = Checkpoint(step=0, path=folder / "step0", format="olmo_core")
    # Start-up is not the model's: the framework's modules imported and the mesh built before the baseline.
    import olmo_core.distributed.checkpoint  # noqa: F401
    import olmo_core.nn.transformer  # noqa: F401

    import inloop_eval.integrations.olmo_core.layout  # noqa: F401

    if layout.sharded:
        layout.mesh()
    if world()[0] > 1:
        dist.barrier()
    before = status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark back to the resident memory now
    loaded = load_model(checkpoint, device, layout=layout)
    peak = status_kib("VmHWM")
    result = {
        "rank": world()[1],
        "peak_mib": (peak - before) / 1024,
        "read_mib": sum(r.nbytes for r in loaded.reads) / 2**20 if loaded.reads else None,
        "params_mib": sum(
            p.to_local().nbytes if hasattr(p, "to_local") else p.nbytes for p in loaded.model.parameters()
        )
        / 2**20,
    }
    (out / f"rank{world()[1]}.json").write_text(json.dumps(result))
    if world()[0] > 1:
        dist.barrier()
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/watch_memory"))
    parser.add_argument("--load", choices=sorted(LAYOUTS), help=argparse.SUPPRESS)  # one layout's ranks
    parser.add_argument("--tp", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--fsdp", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        out = args.dir / "results" / args.load
        out.mkdir(parents=True, exist_ok=True)
        load(args.dir, args.tp, args.fsdp, out)
        return
    if not (args.dir / "step0" / "config.json").is_file():
        save(args.dir, args.d_model, args.layers)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    peaks = {}
    for layout, options in LAYOUTS.items():
        me = [
            sys.executable,
            "-m",
            "benchmarks.watch_memory",
            "--dir",
            str(args.dir),
            "--load",
            layout,
            *options,
        ]
        if layout != "whole":
            me = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", *me[1:]]
        subprocess.run(me, check=True, env=env, cwd=Path(__file__).resolve().parents[1])
        ranks = [
            json.loads(p.read_text()) for p in sorted((args.dir / "results" / layout).glob("rank*.json"))
        ]
        peaks[layout] = [r["peak_mib"] for r in ranks]
        print(json.dumps({"layout": layout, "ranks": ranks}))
    whole = peaks["whole"][0]
    ratios = {layout: [round(p / whole, 3) for p in peaks[layout]] for layout in ("fsdp", "tp2")}
    print(json.dumps({"one_process_peak_mib": round(whole, 1), "ratio_per_rank": ratios}))


if __name__ == "__main__":
    main()
