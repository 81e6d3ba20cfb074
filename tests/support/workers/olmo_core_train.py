"""A tiny OLMo-core model trained for a few steps by the real OLMo-core `Trainer`, with or without the in-loop
evaluation callback; in process (tests/integrations/test_olmo_core_callback.py imports `train`) or under
torchrun (tests/support/workers/olmo_core_ranks.py). `train` returns the metrics OLMo-core passed to its
callbacks' `log_metrics` per step, the evaluator's max_length per task, and a hash of the trained parameters.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import olmo_core.distributed.parallel as olmo_core_parallel
import torch
import torch.distributed as dist
from olmo_core.config import DType
from olmo_core.data import NumpyDataLoaderConfig, NumpyFSLDatasetConfig, TokenizerConfig
from olmo_core.distributed.parallel import DataParallelType
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.optim import AdamWConfig
from olmo_core.train import Duration, Trainer, TrainerConfig
from olmo_core.train.callbacks import Callback, CheckpointerCallback
from olmo_core.train.train_module import TransformerDataParallelConfig, TransformerTrainModuleConfig
from torch.distributed.tensor import DTensor

from inloop_eval.integrations import SECONDS_KEY
from inloop_eval.integrations.olmo_core.callback import InLoopEvalCallbackConfig

SEQ_LEN = 128
STEPS = 4
INTERVAL = 2
GLOBAL_SEQUENCES = 2  # per step, over all ranks
TASKS = ["piqa", "arc_easy_rc_5shot"]
LIMIT = 6


class MetricsCollector(Callback):
    """Keeps what OLMo-core hands to every callback's `log_metrics`: the metrics after its own reduction."""

    def __init__(self) -> None:
        self.logged: dict[int, dict[str, float]] = {}
        self.evaluations: dict[int, int] = {}  # deliveries holding an evaluation's figures, per step

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.logged.setdefault(step, {}).update(metrics)
        if SECONDS_KEY in metrics:
            self.evaluations[step] = self.evaluations.get(step, 0) + 1


def fresh_world_mesh() -> None:
    """OLMo-core keeps one world mesh per process, built by its first train module: after this, the next
    trainer of the process builds its own over the same ranks."""
    olmo_core_parallel._WORLD_MESH = None


def runs_in_turn(runs: Iterable[tuple[str, Callable[[], Any]]], out: Path) -> None:
    """Each named run one after the other in this process group (Python, torch and OLMo-core start once),
    each trainer building its own world mesh; every rank writes what a run returned to
    `<out>/<name>/rank<r>.json`."""
    for name, run in runs:
        fresh_world_mesh()
        result = run()
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
        dist.barrier()


def write_tokens(path: Path, n_tokens: int, dtype: type[np.unsignedinteger] = np.uint16) -> Path:
    """Seeded random token ids, as OLMo's memmap files hold them (`dtype`: the dataset's, by vocabulary)."""
    rng = np.random.default_rng(0)
    rng.integers(2, 50000, size=n_tokens).astype(dtype).tofile(path)
    return path


def callback_config(data_root: Path, **overrides: Any) -> InLoopEvalCallbackConfig:
    fields: dict[str, Any] = dict(
        tasks=TASKS,
        tokenizer=TokenizerConfig.gpt_neox_olmo_dolma_v1_5(),
        eval_interval=INTERVAL,
        limit=LIMIT,
        batch_tokens=1024,
        eval_on_startup=True,
        eval_on_finish=True,
        data_root=str(data_root),
    )
    fields.update(overrides)
    return InLoopEvalCallbackConfig(**fields)


def model_config(tokenizer: TokenizerConfig | None = None) -> TransformerConfig:
    """The tiny 2-layer model (vocabulary: the tokenizer's, default GPT-NeoX)."""
    tokenizer = tokenizer or TokenizerConfig.gpt_neox_olmo_dolma_v1_5()
    return TransformerConfig.llama_like(
        d_model=32, vocab_size=tokenizer.padded_vocab_size(), n_layers=2, n_heads=2, hidden_size_multiple_of=16
    )


def train(
    work: Path,
    data_root: Path,
    *,
    with_callback: bool,
    dropout: float = 0.0,
    flash: bool = False,
    autocast: DType | None = None,
    steps: int = STEPS,
    tokenizer: TokenizerConfig | None = None,
    callback: InLoopEvalCallbackConfig | None = None,
    extra_callbacks: dict[str, Any] | None = None,
    save_interval: int | None = None,
    fit: bool = True,
    train_module_fields: dict[str, Any] | None = None,
    **trainer_fields: Any,
) -> tuple[dict[str, Any], Trainer]:
    """Train the seeded tiny model for `steps` steps; returns (what OLMo-core logged, the evaluator's
    max_length per task (with the callback) and a hash of the final parameters; the trainer).

    flash: the model on flash-attention 2 (`flash_on_cpu`: built as on a GPU, trained with a stand-in kernel
        that raises in any forward without gradient, as an evaluation's).
    tokenizer: of the model, the data and the callback; default GPT-NeoX (OLMo 1's).
    callback: the in-loop callback's config (default `callback_config(data_root)`), under `inloop_eval`.
    extra_callbacks: more callbacks by name. save_interval: save a checkpoint every this many steps into
    `<work>/save` (a run with the same `work` resumes from there); None: no checkpoints.
    fit: False builds the trainer and returns it untrained. trainer_fields: more `TrainerConfig` fields.
    train_module_fields: more `TransformerTrainModuleConfig` fields (`tp_config`, `cp_config`, `dp_config`
    replacing DDP); each data-parallel rank's micro-batch is its share of the global batch.
    """
    distributed = dist.is_initialized()
    tokenizer = tokenizer or TokenizerConfig.gpt_neox_olmo_dolma_v1_5()
    config = model_config(tokenizer)
    config.block.dropout = dropout or None
    kernel: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    torch.manual_seed(0)
    if flash:
        from flash_on_cpu import flash_build, flash_kernel

        config.block.sequence_mixer.backend = "flash_2"
        with flash_build():
            model = config.build(init_device="cpu")
        kernel = flash_kernel()
    else:
        model = config.build(init_device="cpu")
    module_fields: dict[str, Any] = {
        "dp_config": TransformerDataParallelConfig(name=DataParallelType.ddp) if distributed else None,
        **(train_module_fields or {}),
    }
    world = dist.get_world_size() if distributed else 1
    for parallel in ("tp_config", "cp_config"):
        if module_fields.get(parallel) is not None:
            world //= module_fields[parallel].degree
    train_module = TransformerTrainModuleConfig(
        rank_microbatch_size=GLOBAL_SEQUENCES // world * SEQ_LEN,
        max_sequence_length=SEQ_LEN,
        optim=AdamWConfig(lr=1e-2),
        autocast_precision=autocast,
        **module_fields,
    ).build(model, device=torch.device("cpu"))
    tokens = work / "tokens.npy"
    work.mkdir(parents=True, exist_ok=True)
    dataset_config = NumpyFSLDatasetConfig(
        paths=[str(tokens)], sequence_length=SEQ_LEN, tokenizer=tokenizer, work_dir=str(work / "dataset")
    )
    if not distributed or dist.get_rank() == 0:
        # The same file for every run up to STEPS steps, so that a longer run resumes a shorter one's data.
        write_tokens(tokens, SEQ_LEN * GLOBAL_SEQUENCES * (max(steps, STEPS) + 2), dataset_config.get_dtype())
    if distributed:
        dist.barrier()
    dataset = dataset_config.build()
    loader = NumpyDataLoaderConfig(global_batch_size=GLOBAL_SEQUENCES * SEQ_LEN, seed=0).build(
        dataset, dp_process_group=train_module.dp_process_group
    )
    trainer_config = TrainerConfig(
        save_folder=str(work / "save"),
        save_overwrite=True,
        no_checkpoints=save_interval is None,
        max_duration=Duration.steps(steps),
        metrics_collect_interval=1,
        **trainer_fields,
    ).with_callback("collector", MetricsCollector())
    if save_interval is not None:
        trainer_config.callbacks["checkpointer"] = CheckpointerCallback(save_interval=save_interval)
    if with_callback:
        trainer_config = trainer_config.with_callback(
            "inloop_eval", callback or callback_config(data_root, tokenizer=tokenizer)
        )
    trainer_config = trainer_config.with_callbacks(extra_callbacks or {})
    trainer = trainer_config.build(train_module, loader)
    if not fit:
        return {}, trainer
    with kernel:
        trainer.fit()
    return collected(trainer), trainer


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def collected(trainer: Trainer) -> dict[str, Any]:
    """What the collector kept of a trained (or checkpoint-evaluating) trainer, the evaluator's max_length
    per task evaluated (with the callback) and a hash of the model's parameters."""
    train_module = trainer.train_module
    with_callback = "inloop_eval" in trainer.callbacks
    collector = trainer.callbacks["collector"]  # with_callback deep-copied the one passed in
    # This rank's part of each parameter (a DTensor's local shard).
    params = torch.cat([_local(p).detach().reshape(-1).float() for p in train_module.model.parameters()])
    max_lengths = {}
    if with_callback:
        evaluator = trainer.callbacks["inloop_eval"].evaluator
        details = {name: evaluator.detail(name) for name in evaluator.evaluators}
        max_lengths = {name: d.prepared.max_length for name, d in details.items() if d is not None}
    return {
        "logged": {str(step): metrics for step, metrics in sorted(collector.logged.items())},
        "evaluations": {str(step): n for step, n in sorted(collector.evaluations.items())},
        "max_lengths": max_lengths,
        "params_sha": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
    }
