"""A two-layer llama3 trained for a few steps by torchtitan's real `Trainer` on CPU (gloo), with the in-loop
validator in torchtitan's validator slot; run by torchrun:

    torchrun --nproc_per_node N tests/support/workers/torchtitan_train.py --data-root DIR --work DIR --out DIR
        --config EVAL.yaml --tp 2 [--dp-shard 1] [--dp-replicate 1]

After training, every rank gathers the trained weights into an unsharded copy of the same model and
evaluates it the plain way (full logits, no tensor parallelism, documents sharded over the world): the
reference the validator's figures must equal. Every rank writes `<out>/rank<r>.json`: the validator's figures
and per-request scores at the last step, the reference's, and the keys torchtitan's metric logger received
per step, the tokens each forwarded (the validator's packed rows and kept prefixes, the reference's one
request per row), the lengths of the prefixes the validator kept, and the modules whose instance `forward`
differs after training and validating from before.
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torchtitan_cpu
from torch.distributed.tensor import DTensor
from torch.utils.data import IterableDataset

STEPS = 2
FREQ = 2  # torchtitan validates at step 1 and every FREQ steps: both steps here
SEQ_LEN = 256  # room for five shots, which the validator keeps once (a prefix is kept from 64 tokens on)
LOCAL_BATCH = 2
N_LAYERS = 2
VOCAB = 50304  # the GPT-NeoX tokenizer's 50277 ids, rounded up to a multiple of 64


class RandomTokens(IterableDataset):
    """Seeded random token rows (one document each, positions from 0), different per data-parallel rank."""

    def __init__(self, seq_len: int, seed: int) -> None:
        self.seq_len, self.seed = seq_len, seed

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed)
        while True:
            tokens = torch.randint(2, 50000, (self.seq_len + 1,), generator=generator)
            yield {"input": tokens[:-1], "positions": torch.arange(self.seq_len)}, tokens[1:]


class MetricsRecorder:
    """Stands in for torchtitan's metric logger (TensorBoard, W&B): keeps the keys logged per step."""

    def __init__(self) -> None:
        self.keys: dict[int, list[str]] = {}

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.keys.setdefault(step, []).extend(metrics)

    def close(self) -> None:
        pass


def tokenizer_dir(data_root: Path, work: Path) -> Path:
    """torchtitan's `hf_assets_path`: the GPT-NeoX tokenizer.json, its EOS named in tokenizer_config.json."""
    from inloop_eval.data.root import neox_tokenizer_path

    out = work / "tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(neox_tokenizer_path(data_root), out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return out


def trainer_config(args: argparse.Namespace) -> Any:
    """torchtitan's llama3 debug model cut to N_LAYERS layers and the tokenizer's vocabulary, float32, SDPA
    attention, no activation checkpointing, the random-token loader, and our validator."""
    from torchtitan.components.dataloader import ParallelAwareDataloader
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    from inloop_eval.integrations.torchtitan.validator import InLoopValidator

    class RandomTokenLoader(ParallelAwareDataloader):
        @dataclass(kw_only=True, slots=True)
        class Config(ParallelAwareDataloader.Config):
            pass

        def __init__(
            self,
            config: Any,
            *,
            dp_world_size: int,
            dp_rank: int,
            seq_len: int,
            local_batch_size: int,
            **_: Any,
        ) -> None:
            dataset = RandomTokens(seq_len, seed=dp_rank)
            super().__init__(
                dataset, dp_rank=dp_rank, dp_world_size=dp_world_size, batch_size=local_batch_size
            )

    config = llama3_debugmodel()
    model = config.model_spec.model
    model.layers = model.layers[:N_LAYERS]
    model.vocab_size = model.tok_embeddings.num_embeddings = model.lm_head.out_features = VOCAB
    torchtitan_cpu.cpu_model_config(model)
    config.loss = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=VOCAB))
    config.hf_assets_path = str(tokenizer_dir(Path(args.data_root), Path(args.work)))
    config.dump_folder = str(Path(args.work) / "dump")
    config.dataloader = RandomTokenLoader.Config()
    config.training.seq_len, config.training.local_batch_size, config.training.steps = (
        SEQ_LEN,
        LOCAL_BATCH,
        STEPS,
    )
    config.training.mixed_precision_param = "float32"
    config.training.disable_cuda_graphs = True
    config.activation_checkpoint = None
    config.checkpoint.enable = False
    config.parallelism.spmd_backend = "partial_dtensor"
    config.parallelism.tensor_parallel_degree = args.tp
    config.parallelism.data_parallel_shard_degree = args.dp_shard
    config.parallelism.data_parallel_replicate_degree = args.dp_replicate
    config.debug.seed = 0
    # A collective that never matches fails the run in a minute instead of torchtitan's five.
    config.comm.init_timeout_seconds = config.comm.train_timeout_seconds = 90
    config.validator = InLoopValidator.Config(
        config=args.config, freq=FREQ, data_root=args.data_root, strict=True
    )
    return config


def unsharded_copy(trainer: Any) -> torch.nn.Module:
    """A plain (unparallelised) model of the trainer's config holding its trained weights, gathered."""
    model = trainer.model_parts[0]
    state = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}
    with torch.device("cpu"):
        reference = trainer.model_config.build()
        reference.init_weights(buffer_device=None)
    reference.load_state_dict(state, strict=True)
    return reference.eval()


def count_kept_prefixes() -> list[int]:
    """The length of every prefix the torchtitan adapter keeps from now on, in the list returned (each routing
    of its forwards that records a prefix, counted)."""
    import inloop_eval.integrations.torchtitan.adapter as titan_adapter

    lengths: list[int] = []
    routing_for = titan_adapter.routing_for

    def counted(*args: Any, **kwargs: Any) -> Any:
        routing = routing_for(*args, **kwargs)
        if routing is not None and routing.record is not None:
            lengths.append(routing.record_length)
        return routing

    titan_adapter.routing_for = counted
    return lengths


def instance_forwards(model: torch.nn.Module) -> dict[str, tuple[Any, Any]]:
    """Each module's instance `forward` (torchtitan's parallelize wrapper, or none) and compiled call, by name:
    what a packed evaluation overrides for the length of a forward and must put back."""
    return {name: (m.__dict__.get("forward"), m._compiled_call_impl) for name, m in model.named_modules()}


def scores(evaluator: Any) -> list[dict[str, Any]]:
    return [
        {k: s[k] for k in ("task", "doc_id", "cont_id", "ll", "ll_uncond", "is_greedy")}
        for s in evaluator.samples()
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--data-root", "--work", "--out", "--config"):
        parser.add_argument(name, required=True)
    for name in ("--tp", "--dp-shard", "--dp-replicate"):
        parser.add_argument(name, type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torchtitan_cpu.use_cpu()

    from inloop_eval.engine.adapters.logits import LogitsAdapter
    from inloop_eval.evaluators.orchestrator import InLoopEvaluator

    kept = count_kept_prefixes()

    trainer = trainer_config(args).build()
    try:
        torchtitan_cpu.sum_reductions(trainer.model_parts[0])
        recorder = MetricsRecorder()
        trainer.metrics_processor.logger = recorder
        before = instance_forwards(trainer.model_parts[0])
        trainer.train()
        after = instance_forwards(trainer.model_parts[0])
        validator = trainer.validator
        reference = unsharded_copy(trainer)
        plain = InLoopEvaluator(validator.evaluator.config, tokenizer=validator.evaluator.tokenizer)
        expected = plain.run(LogitsAdapter(reference, validator.evaluator.config.max_length))
        result = {
            "validator": {
                "metrics": validator.last_metrics,
                "samples": scores(validator.evaluator),
                "tokens": validator.evaluator.tokens_forwarded,
                "kept_prefixes": kept,
            },
            "reference": {"metrics": expected, "samples": scores(plain), "tokens": plain.tokens_forwarded},
            "logged": {str(step): keys for step, keys in recorder.keys.items()},
            "trained_steps": trainer.step,
            "forwards_changed": sorted(name for name in before if before[name] != after[name]),
            "mesh": {"tp": trainer.parallel_dims.tp, "batch": validator.dp_world_size},
        }
        (Path(args.out) / f"rank{dist.get_rank()}.json").write_text(
            json.dumps(result, indent=1, sort_keys=True)
        )
        dist.barrier()
    finally:
        trainer.close()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
