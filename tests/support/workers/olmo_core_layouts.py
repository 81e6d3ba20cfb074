"""The OLMo-core `Trainer` with the in-loop callback under one parallel layout of its train module, on CPU:

    torchrun --nproc_per_node N tests/support/workers/olmo_core_layouts.py --data-root DIR --work DIR --out DIR \
        --layouts tp2,cp2

Layouts (`LAYOUTS`): tensor parallel (`tp2`, under FSDP), Ulysses context parallel (`cp2`, under DDP), FSDP=2 x
TP=2 (`dp2tp2`, 4 processes); `single` (one process, no process group) is the reference
tests/integrations/test_olmo_core_parallel.py runs in its own process. Two callbacks evaluate: `inloop_eval`
(our keys) at startup and after each step, `inloop_eval_olmo` (OLMo-core's keys, from a config file that adds
a PMI task) at startup. The layouts named (of one world size) run one after the other in one launch, each with
a trainer of its own. Every rank writes `<out>/<layout>/rank<r>.json`: what OLMo-core logged per step (`collected`),
at `tp2` the largest tensor the head's scoring allocated per batch (`ScoringMemory`), and, for the distributed layouts,
the refusals of sharding over no group and over the world (and at `tp2`, of evaluating a DDP x TP model before
it has trained).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from olmo_core.distributed.parallel import DataParallelType, get_dp_model_mesh, get_tp_mesh
from olmo_core.train.train_module import (
    TransformerContextParallelConfig,
    TransformerDataParallelConfig,
    TransformerTensorParallelConfig,
)

from inloop_eval.engine.logprobs import chunk_positions
from inloop_eval.engine.outputs.vocab_sharded import ShardedHead
from inloop_eval.errors import ConfigError
from inloop_eval.integrations.callback_config import DEFAULT_BATCH_TOKENS
from inloop_eval.integrations.olmo_core.adapter import OLMoCoreAdapter
from workers.olmo_core_train import callback_config, collected, model_config, runs_in_turn, train
from workers.parallel_checks import LargestTensor

STEPS = 1
LIMIT = 6
# An rc, a letter-key mc and a bpb label of OLMo's.
OLMO_TASKS = ["olmo:piqa", "olmo:mmlu_stem_test_mc_5shot_fast", "olmo:arc_easy_test_bpb_5shot"]
OLMO_KEYS_CONFIG = f"""key_style: olmo_core
strict: true
evaluators:
  - {{task: "olmo:piqa", label: k_piqa, limit: {LIMIT}, batch_tokens: 1024}}
  - {{task: "olmo:mmlu_stem_test_mc_5shot_fast", label: k_mmlu_stem_mc, limit: {LIMIT}, batch_tokens: 1024}}
  - {{task: "olmo:arc_easy_test_bpb_5shot", label: k_arc_easy_bpb, limit: {LIMIT}, batch_tokens: 1024}}
  - {{task: arc_easy, label: k_arc_easy_pmi, limit: {LIMIT}, batch_tokens: 1024, metrics: [acc, acc_norm, acc_pmi]}}
"""


def _fsdp() -> TransformerDataParallelConfig:
    return TransformerDataParallelConfig(name=DataParallelType.fsdp)


def _ddp() -> TransformerDataParallelConfig:
    return TransformerDataParallelConfig(name=DataParallelType.ddp)


# Layout -> (processes, TransformerTrainModuleConfig fields).
LAYOUTS: dict[str, tuple[int, dict[str, Any]]] = {
    "single": (1, {}),
    "tp2": (2, {"dp_config": _fsdp(), "tp_config": TransformerTensorParallelConfig(degree=2)}),
    "cp2": (2, {"dp_config": _ddp(), "cp_config": TransformerContextParallelConfig.ulysses(2)}),
    "dp2tp2": (4, {"dp_config": _fsdp(), "tp_config": TransformerTensorParallelConfig(degree=2)}),
}


class ScoringMemory:
    """While active, the largest tensor (elements) the evaluator's head scoring allocates per batch of an
    OLMo-core model under tensor parallelism, where its head scores every target on this rank's slice of the
    vocabulary (`ShardedHead.target_logprobs`, inside the model's forward), with the bound [C, V/TP] of a chunk
    of C positions (`chunk_positions`: the same chunk one process scores on the whole vocabulary)."""

    def __init__(self) -> None:
        self.record: list[dict[str, int]] = []

    @contextlib.contextmanager
    def active(self, model: torch.nn.Module) -> Iterator[None]:
        mode = PausableLargest()
        pause = model.register_forward_pre_hook(lambda *_: mode.pause(True))
        resume = model.register_forward_hook(lambda *_: mode.pause(False))
        score = ShardedHead.target_logprobs

        def recording_score(head: ShardedHead, features_UX: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            mode.largest = 0
            mode.pause(False)
            with mode:
                result = score(head, features_UX, *args, **kwargs)
            mode.pause(True)
            chunk = min(int(features_UX.shape[0]), chunk_positions(head.vocab))
            self.record.append({"largest": mode.largest, "bound": chunk * int(head.weight_LX.shape[0])})
            return result

        ShardedHead.target_logprobs = recording_score  # type: ignore[method-assign]
        try:
            yield
        finally:
            ShardedHead.target_logprobs = score  # type: ignore[method-assign]
            pause.remove()
            resume.remove()


class PausableLargest(LargestTensor):
    """`LargestTensor` that ignores what is allocated while paused (the model's own forward)."""

    paused = False

    def pause(self, paused: bool) -> None:
        self.paused = paused

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if self.paused:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


def ddp_tp_refusal(trainer: Any, data_root: Path) -> str:
    """The error of evaluating, before any training forward, the tiny model under torch's DDP (replicate)
    over tensor parallelism, as OLMo-core's DataParallelType.ddp with a tp_config applies them."""
    mesh = trainer.train_module.world_mesh
    model = model_config().build(init_device="cpu")
    model.apply_tp(get_tp_mesh(mesh))
    model.apply_ddp(dp_mesh=get_dp_model_mesh(mesh))
    evaluator = trainer.callbacks["inloop_eval"].evaluator
    try:
        evaluator.run(model, dp_group=trainer.train_module.dp_process_group)
    except ConfigError as exc:
        return str(exc)
    return "ran"


def odd_max_length_refusal(trainer: Any, work: Path, data_root: Path) -> str:
    """The error of building our callback for this tensor-parallel trainer with a `max_length` (63) that
    is not a multiple of its TP degree."""
    config_file = work / "odd_max_length.yaml"
    config_file.write_text(f'max_length: 63\nevaluators:\n  - {{task: copa, limit: {LIMIT}}}\n')
    config = callback_config(data_root, tasks=None, limit=None, batch_tokens=DEFAULT_BATCH_TOKENS, config=str(config_file))
    try:
        config.build(trainer)
    except ConfigError as exc:
        return str(exc)
    return "built"


def run_layout(layout: str, work: Path, data_root: Path) -> dict[str, Any]:
    """Train `STEPS` steps under `layout` with both callbacks; what OLMo-core logged, and (distributed) the
    errors of evaluating over no data-parallel group and over the whole world."""
    work.mkdir(parents=True, exist_ok=True)
    config_file = work / "olmo_keys.yaml"
    config_file.write_text(OLMO_KEYS_CONFIG)
    common = dict(eval_on_startup=True, strict=True)
    ours = callback_config(data_root, tasks=OLMO_TASKS, limit=LIMIT, eval_interval=1, **common)
    olmo_keys = callback_config(
        data_root, tasks=None, limit=None, batch_tokens=DEFAULT_BATCH_TOKENS, config=str(config_file),
        eval_interval=1000, eval_on_finish=False, **common
    )
    _, fields = LAYOUTS[layout]
    _, trainer = train(
        work, data_root, with_callback=True, steps=STEPS, callback=ours,
        extra_callbacks={"inloop_eval_olmo": olmo_keys}, train_module_fields=fields, fit=False,
    )
    if layout == "tp2":  # recording every op costs time: one layout is enough
        memory = ScoringMemory()
        with memory.active(trainer.train_module.model):
            trainer.fit()
    else:
        trainer.fit()
    result = collected(trainer)
    evaluator = trainer.callbacks["inloop_eval"].evaluator
    result["evaluator_tokens"] = evaluator.tokens_forwarded  # this rank's, at the last step
    if not dist.is_initialized():  # one process packs rows with kept prefixes: count it unpacked too
        model = trainer.train_module.model
        unpacked = OLMoCoreAdapter(model, trainer.train_module.eval_batch_spec.max_sequence_length)
        unpacked.packing = False
        evaluator.run(unpacked, step=STEPS)
        result["unpacked_evaluator_tokens"] = evaluator.tokens_forwarded
    if layout == "tp2":
        result["memory"] = memory.record
        result["ddp_tp_startup"] = ddp_tp_refusal(trainer, data_root)
        result["odd_max_length"] = odd_max_length_refusal(trainer, work, data_root)
    if dist.is_initialized():
        evaluator = trainer.callbacks["inloop_eval"].evaluator
        for name, group in (("no_group", None), ("world_group", dist.group.WORLD)):
            try:
                evaluator.run(trainer.train_module.model, dp_group=group)
                result[name] = "ran"
            except ConfigError as exc:
                result[name] = str(exc)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layouts", required=True, help="comma-separated, each of the same world size")
    args = parser.parse_args()
    layouts = args.layouts.split(",")
    unknown = sorted(set(layouts) - set(LAYOUTS))
    if unknown:
        parser.error(f"--layouts: unknown {unknown}; known: {sorted(LAYOUTS)}")
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        runs_in_turn(
            [(layout, functools.partial(run_layout, layout, args.work / layout, args.data_root)) for layout in layouts],
            args.out,
        )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
