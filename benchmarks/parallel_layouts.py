"""Seconds per evaluation and memory of the in-loop evaluator on an OLMo-core model under each parallel layout
of OLMo-core's train module, on CPU (gloo) or GPUs (nccl):

    python -m benchmarks.parallel_layouts --layout single
    torchrun --nproc_per_node 2 -m benchmarks.parallel_layouts --layout tp2      # or cp2
    torchrun --nproc_per_node 4 -m benchmarks.parallel_layouts --layout dp2tp2   # FSDP=2 x TP=2

The model: an `olmo2`-shaped OLMo-core Transformer (`--d-model`, `--layers`, the GPT-NeoX vocabulary of 50,304,
seeded random init), built into a `TransformerTrainModule` with the layout's `dp_config` / `tp_config` /
`cp_config` (TP and DP x TP under FSDP, Ulysses CP under DDP), evaluated by `InLoopEvaluator.run(model,
dp_group=train_module.dp_process_group)` on `--tasks` (`--limit` documents each), `--repeats` times after one
warm-up run (which loads, tokenizes and plans). Rank 0 prints one JSON line: seconds per evaluation (median),
peak resident memory of each rank (MiB, `ru_maxrss`: the whole process, model and data included), the peak
device memory on GPUs, and the tokens forwarded as `eval/tokens_forwarded` counts them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/parallel_layouts.py`: import `benchmarks` as `-m` would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
from olmo_core.data import TokenizerConfig
from olmo_core.distributed.parallel import DataParallelType
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.optim import AdamWConfig
from olmo_core.train.train_module import (
    TransformerContextParallelConfig,
    TransformerDataParallelConfig,
    TransformerTensorParallelConfig,
    TransformerTrainModule,
    TransformerTrainModuleConfig,
)

from inloop_eval import InLoopEvaluator
from inloop_eval.data.root import default_data_root
from inloop_eval.distributed import all_reduce_sum, init_from_env
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.integrations.olmo_core.callback import olmo_tokenizer

LAYOUTS = {
    "single": {},
    "tp2": {"dp": DataParallelType.fsdp, "tp": 2},
    "cp2": {"dp": DataParallelType.ddp, "cp": 2},
    "dp2tp2": {"dp": DataParallelType.fsdp, "tp": 2},
}


def train_module(layout: str, d_model: int, layers: int, seq_len: int, device: torch.device) -> TransformerTrainModule:
    """The model inside OLMo-core's train module under `layout` (FSDP or DDP with TP or CP applied)."""
    spec = LAYOUTS[layout]
    tokenizer = TokenizerConfig.gpt_neox_olmo_dolma_v1_5()
    config = TransformerConfig.llama_like(
        d_model=d_model, vocab_size=tokenizer.padded_vocab_size(), n_layers=layers, n_heads=max(d_model // 64, 2)
    )
    torch.manual_seed(0)
    fields = {}
    if "dp" in spec:
        fields["dp_config"] = TransformerDataParallelConfig(name=spec["dp"])
    if "tp" in spec:
        fields["tp_config"] = TransformerTensorParallelConfig(degree=spec["tp"])
    if "cp" in spec:
        fields["cp_config"] = TransformerContextParallelConfig.ulysses(spec["cp"])
    return TransformerTrainModuleConfig(
        rank_microbatch_size=seq_len, max_sequence_length=seq_len, optim=AdamWConfig(lr=1e-3), **fields
    ).build(config.build(init_device="cpu"), device=device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layout", choices=sorted(LAYOUTS), required=True)
    parser.add_argument("--tasks", default="olmo:piqa,olmo:mmlu_stem_test_mc_5shot_fast,olmo:arc_easy_test_bpb_5shot")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = init_from_env()
    if LAYOUTS[args.layout] and not dist.is_initialized():
        raise SystemExit(f"--layout {args.layout} needs torchrun (see the module docstring)")
    module = train_module(args.layout, args.d_model, args.layers, args.seq_len, device)
    root = default_data_root()
    entries = [{"task": t, "limit": args.limit, "batch_tokens": args.batch_tokens} for t in args.tasks.split(",")]
    config = EvaluatorConfig.from_dict(
        {"evaluators": entries, "max_length": args.seq_len, "strict": True, "data_root": str(root)}, "benchmark"
    )
    evaluator = InLoopEvaluator(config, tokenizer=olmo_tokenizer(TokenizerConfig.gpt_neox_olmo_dolma_v1_5(), root))
    dp_group = module.dp_process_group
    evaluator.run(module.model, dp_group=dp_group)  # warm-up: loads, tokenizes, plans
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds = []
    for _ in range(args.repeats):
        if dist.is_initialized():
            dist.barrier()
        start = time.perf_counter()
        evaluator.run(module.model, dp_group=dp_group)
        seconds.append(time.perf_counter() - start)
    tokens = all_reduce_sum(evaluator.tokens_forwarded, dp_group)
    rss_mib = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024])
    world = dist.get_world_size() if dist.is_initialized() else 1
    every_rss = [torch.zeros_like(rss_mib) for _ in range(world)]
    if dist.is_initialized():
        dist.all_gather(every_rss, rss_mib)
    else:
        every_rss = [rss_mib]
    if not dist.is_initialized() or dist.get_rank() == 0:
        line = {
            "layout": args.layout,
            "processes": world,
            "threads_per_process": torch.get_num_threads(),
            "seconds_per_eval": round(statistics.median(seconds), 3),
            "peak_rss_mib_per_rank": [round(float(r), 1) for r in every_rss],
            "tokens_forwarded": tokens,
            "model": f"d_model={args.d_model} layers={args.layers} vocab=50304",
            "tasks": args.tasks,
            "limit": args.limit,
        }
        if device.type == "cuda":
            line["peak_cuda_mib_rank0"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        print(json.dumps(line))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
