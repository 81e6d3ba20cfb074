"""Checks of the evaluator on the reference GPT split into two pipeline stages (torch.distributed.pipelining);
in-process for world size 1 (the unsplit model: the reference). They run in the launches of
tests/support/workers/parallel_checks.py, as `pipeline_<check>`:

    torchrun --nproc_per_node N tests/support/workers/parallel_checks.py --data-root DIR --out DIR \
        --checks pipeline_layouts

tests/engine/test_parallelism.py compares each rank's results with one process. The perplexity domains are
written under $INLOOP_EVAL_HOME (one folder per launch).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lm_helpers import lm_entry, write_domains
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.pipelining.schedules import PipelineScheduleSingle

from inloop_eval.engine.adapters.pipeline import PipelineAdapter
from inloop_eval.errors import ModelOutputError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.models.gpt import GPT, GPTConfig
from workers.dist_checks import Context, draw_random_numbers, params_digest, refusal, samples

SEQ_LEN = 64  # the schedule's fixed row length, and the longest request (the reference's max_length)
MICRO_BATCHES = 2
BATCH_ROWS = 4  # rows of a schedule step: 2 micro-batches of 2 rows
# A ranked-classification task, a letter-key task (every choice a token at one position) and PMI (with
# unconditional requests); limits no world size divides evenly; budgets that give batches of more rows than
# a step holds, and fewer.
TASKS: list[dict[str, Any]] = [
    {"task": "copa", "limit": 7, "batch_tokens": 120},
    {"task": "mmlu_mc", "limit": 5, "batch_tokens": 300},
    {"task": "arc_easy", "limit": 5, "batch_tokens": 160, "metrics": ["acc", "acc_norm", "acc_pmi"]},
]
TRAIN_TASKS: list[dict[str, Any]] = [{"task": "copa", "limit": 4, "batch_tokens": 256}]


def tiny_gpt(dropout: float = 0.0) -> GPT:
    """The same seeded model on every rank."""
    torch.manual_seed(1234)
    return GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=SEQ_LEN, dropout=dropout))


class GPTPart(nn.Module):
    """Contiguous blocks of the GPT, after its embeddings (`first`: input ids [B, T] in) and before its final
    norm and head (`last`: logits [B, T, V] out; with `head=False` the normed hidden states [B, T, D], a last
    stage that does not return logits); hidden states [B, T, D] in and out otherwise."""

    def __init__(self, gpt: GPT, blocks: slice, *, first: bool, last: bool, head: bool = True) -> None:
        super().__init__()
        self.first, self.last = first, last
        self.tok_emb, self.pos_emb = (gpt.tok_emb, gpt.pos_emb) if first else (None, None)
        self.blocks = gpt.blocks[blocks]
        self.ln_f = gpt.ln_f if last else None
        self.lm_head = gpt.lm_head if last and head else None

    def forward(self, x: Tensor) -> Tensor:
        if self.tok_emb is not None and self.pos_emb is not None:
            positions = torch.arange(x.shape[1], device=x.device).expand_as(x)
            x = self.tok_emb(x) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x, None)
        if self.ln_f is not None:
            x = self.ln_f(x)
        return self.lm_head(x) if self.lm_head is not None else x


# The two layers' GPT in 2 stages (embeddings and a block | a block and the head) or in 4 (embeddings |
# block 0 | block 1 | head), as (block slice, first, last).
SPLITS = {
    2: [(slice(0, 1), True, False), (slice(1, 2), False, True)],
    4: [
        (slice(0, 0), True, False),
        (slice(0, 1), False, False),
        (slice(1, 2), False, False),
        (slice(2, 2), False, True),
    ],
}


def next_token_loss(logits_BTV: Tensor, ids_BT: Tensor) -> Tensor:
    return nn.functional.cross_entropy(
        logits_BTV[:, :-1].reshape(-1, logits_BTV.shape[-1]), ids_BT[:, 1:].reshape(-1)
    )


def pipeline(
    gpt: GPT,
    mesh: DeviceMesh,
    *,
    loss: bool = False,
    head: bool = True,
    schedule_class: type[Any] = ScheduleGPipe,
    n_stages: int = 2,
) -> tuple[Any, list[PipelineStage]]:
    """This rank's stages of `gpt` split in `n_stages` over the mesh's `pp` dimension (stage s on pipeline
    rank s mod the degree: one per rank, or a looped placement for an interleaved schedule), and its
    schedule (a single-stage class takes this rank's stage, a multi-stage one the list)."""
    pp = mesh["pp"]
    stages = []
    for index in range(pp.get_local_rank(), n_stages, pp.size()):
        blocks, first, last = SPLITS[n_stages][index]
        module = GPTPart(gpt, blocks, first=first, last=last, head=head)
        stages.append(PipelineStage(module, index, n_stages, torch.device("cpu"), group=pp.get_group()))
    loss_fn = next_token_loss if loss else None
    held = stages[0] if issubclass(schedule_class, PipelineScheduleSingle) else stages
    return schedule_class(held, n_microbatches=MICRO_BATCHES, loss_fn=loss_fn), stages


def adapter_for(gpt: GPT, mesh: DeviceMesh, **kwargs: Any) -> PipelineAdapter:
    schedule, stages = pipeline(gpt, mesh, **kwargs)
    return PipelineAdapter(schedule, stages, batch_rows=BATCH_ROWS, seq_len=SEQ_LEN)


def evaluator(ctx: Context, entries: list[dict[str, Any]]) -> InLoopEvaluator:
    config = EvaluatorConfig(
        evaluators=[dict(e) for e in entries], data_root=str(ctx.data_root), max_length=SEQ_LEN, strict=True
    )
    return InLoopEvaluator(config, tokenizer=ctx.tokenizer)


def entries(ctx: Context) -> list[dict[str, Any]]:
    """TASKS and one perplexity entry over domain files written once per launch (rank 0, then a barrier)."""
    home = Path(os.environ["INLOOP_EVAL_HOME"])
    files = {"code": home / "domains" / "code", "prose": home / "domains" / "prose.jsonl"}
    files["tiny"] = home / "domains" / "tiny.npy"
    if ctx.rank == 0:
        write_domains(home / "domains", ctx.tokenizer)
    if ctx.world_size > 1:
        dist.barrier()
    return [*TASKS, lm_entry(files, home / "lm_cache", batch_tokens=300)]


def check_layouts(ctx: Context) -> dict[str, Any]:
    """World size 1: the unsplit model (the reference). 2: PP=2, and the refusals (no data-parallel group,
    the world as one). 4: DP=2 x PP=2 (mesh (dp, pp): ranks 0, 1 and 2, 3 are pipelines)."""
    ev = evaluator(ctx, entries(ctx))
    if ctx.world_size == 1:
        reference = {"metrics": ev.run(tiny_gpt()), "samples": samples(ev)}
        return {"reference": reference, "train_tasks": evaluator(ctx, TRAIN_TASKS).run(tiny_gpt())}
    mesh = init_device_mesh("cpu", (ctx.world_size // 2, 2), mesh_dim_names=("dp", "pp"))
    adapter = adapter_for(tiny_gpt(), mesh)
    metrics = ev.run(adapter, dp_group=mesh["dp"])
    out: dict[str, Any] = {
        "metrics": metrics,
        "samples": samples(ev),
        "tokens_scored": ev.tokens_forwarded,
        "last_rank": adapter.last_rank,
    }
    if ctx.world_size == 2:
        interleaved = adapter_for(tiny_gpt(), mesh, schedule_class=ScheduleInterleaved1F1B, n_stages=4)
        out["interleaved"] = {"metrics": ev.run(interleaved, dp_group=mesh["dp"]), "samples": samples(ev)}
        out["no_group"] = refusal(lambda: ev.run(adapter))
        out["world_group"] = refusal(lambda: ev.run(adapter, dp_group=dist.group.WORLD))
    return out


def check_last_stage_failure(ctx: Context) -> dict[str, Any]:
    """A last stage returning hidden states [B, T, D], narrower than the tokenizer's vocabulary: the last
    stage's error reaches every rank of the pipeline, which all raise it."""
    mesh = init_device_mesh("cpu", (ctx.world_size // 2, 2), mesh_dim_names=("dp", "pp"))
    adapter = adapter_for(tiny_gpt(), mesh, head=False)
    try:
        evaluator(ctx, TASKS[:1]).run(adapter, dp_group=mesh["dp"])
    except ModelOutputError as exc:
        return {"error": str(exc)}
    return {"error": None}


def train(ctx: Context, mesh: DeviceMesh, *, eval_every: int | None, steps: int = 4) -> dict[str, Any]:
    """Seeded PP=2 training with dropout through a 1F1B schedule with a loss; in-loop eval through the same
    schedule every `eval_every` steps (step 0 included: the untrained model's figures kept). The same
    batches on both stages (drawn from the torch RNG, which an evaluation that moved it would change)."""
    schedule, stages = pipeline(tiny_gpt(dropout=0.1), mesh, loss=True, schedule_class=Schedule1F1B)
    stage = stages[0]
    module = stage.submod
    module.register_forward_pre_hook(draw_random_numbers)
    adapter = PipelineAdapter(schedule, stages, batch_rows=BATCH_ROWS, seq_len=SEQ_LEN)
    ev = evaluator(ctx, TRAIN_TASKS)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-2)
    torch.manual_seed(100)
    module.train()
    losses: list[float] = []
    metrics: dict[str, float] = {}
    for step in range(steps):
        if eval_every is not None and step % eval_every == 0:
            figures = ev.run(adapter, step=step, dp_group=mesh["dp"])
            metrics = metrics or figures
        ids = torch.randint(0, 50000, (4, 24))
        step_losses: list[Tensor] = []
        if stage.is_first:
            schedule.step(ids)
        else:
            schedule.step(target=ids, losses=step_losses)
        losses.append(float(sum(step_losses)) if step_losses else 0.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {
        "params": params_digest(module),
        "losses": losses,
        "metrics": metrics,
        "training": module.training,
    }


def check_training(ctx: Context) -> dict[str, Any]:
    """PP=2 training ends bit for bit the same with and without evaluations through its schedule."""
    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "pp"))
    return {"with_eval": train(ctx, mesh, eval_every=2), "without": train(ctx, mesh, eval_every=None)}


CHECKS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "layouts": check_layouts,
    "last_stage_failure": check_last_stage_failure,
    "training": check_training,
}
