"""OLMo-core's pipeline-parallel train module (degree 1, two stages on this rank) built on CPU, and what the
in-loop callback says when a trainer with it is built; run by torchrun (one process):

    torchrun --nproc_per_node 1 tests/support/workers/olmo_core_pipeline.py --out FILE

Writes `{"train_module": class name, "stages": model parts, "error": the callback's ConfigError}` to FILE.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from olmo_core.data import TokenizerConfig
from olmo_core.distributed.parallel import DataParallelType, PipelineScheduleType
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.optim import AdamWConfig
from olmo_core.train.train_module import (
    TransformerDataParallelConfig,
    TransformerPipelineParallelConfig,
    TransformerPipelineTrainModuleConfig,
)

from inloop_eval.errors import ConfigError
from inloop_eval.integrations.olmo_core.callback import InLoopEvalCallbackConfig


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    tokenizer = TokenizerConfig.gpt_neox_olmo_dolma_v1_5()
    model = TransformerConfig.llama_like(
        d_model=32,
        vocab_size=tokenizer.padded_vocab_size(),
        n_layers=2,
        n_heads=2,
        hidden_size_multiple_of=16,
    ).build(init_device="cpu")
    pp = TransformerPipelineParallelConfig(
        degree=1, schedule=PipelineScheduleType.custom_interleaved_1F1B, use_custom_stage_implementation=True
    )
    train_module = TransformerPipelineTrainModuleConfig(
        rank_microbatch_size=64,
        max_sequence_length=64,
        optim=AdamWConfig(lr=1e-2),
        dp_config=TransformerDataParallelConfig(name=DataParallelType.ddp),
        pp_config=pp,
    ).build(model, device=torch.device("cpu"))
    error = None
    try:
        InLoopEvalCallbackConfig(tasks=["piqa"], tokenizer=tokenizer).build(
            SimpleNamespace(train_module=train_module)
        )
    except ConfigError as exc:
        error = str(exc)
    result = {
        "train_module": type(train_module).__name__,
        "stages": len(train_module.model_parts),
        "error": error,
    }
    args.out.write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
