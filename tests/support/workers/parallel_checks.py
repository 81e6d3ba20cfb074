"""Checks of the evaluator with a data-parallel group and a tensor-parallel model, run by torchrun (or
in-process for world size 1, the reference).

    torchrun --nproc_per_node N tests/support/workers/parallel_checks.py --data-root DIR --out DIR --checks a,b

Every rank writes `<out>/rank<r>.json`: check name -> JSON-able result; tests/engine/test_parallelism.py
compares them with one process. The checks of tests/support/workers/pipeline_checks.py run here too, as
`pipeline_<check>`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from inloop_eval import (
    AdapterNeeds,
    ForwardInputs,
    ModelAdapter,
    ModelFamily,
    VocabSharded,
    register_model_family,
)
from inloop_eval.engine.adapters.logits import LogitsAdapter
from inloop_eval.engine.families import unregister_model_family
from inloop_eval.engine.outputs.projected_head import ProjectedHead
from inloop_eval.errors import ConfigError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.models.gpt import GPT, GPTConfig
from workers import pipeline_checks
from workers.dist_checks import Context, per_rank, samples, tiny_gpt
from workers.launch import checks_main

MAX_LENGTH = 512
GPT_VOCAB = GPTConfig.vocab_size
# A ranked-classification task, a letter-key task (every choice a token at one position) and PMI (with
# unconditional requests); limits no world size divides evenly.
TASKS: list[dict[str, Any]] = [
    {"task": "copa", "limit": 13, "batch_tokens": 96},
    {"task": "mmlu_mc", "limit": 10, "batch_tokens": 256},
    {"task": "arc_easy", "limit": 11, "batch_tokens": 160, "metrics": ["acc", "acc_norm", "acc_pmi"]},
]


def rows(ev: Any) -> dict[str, list[int]]:
    """The request rows this rank scored, per task."""
    return {name: ev.detail(name).rows.tolist() for name in ev.evaluators}


def check_layouts(ctx: Context) -> dict[str, Any]:
    """The (dp, tp) splits of the world (tp = 2 at world size 4, tp = 1 and 2 at 2) with a replicated model,
    the groups given as a mesh; at world size 4 also as the data-parallel ProcessGroup. World size 1: the
    reference, no group."""
    world_size = ctx.world_size
    if world_size == 1:
        return {"reference": {"metrics": ctx.evaluator(TASKS, strict=True).run(tiny_gpt())}}
    out: dict[str, Any] = {}
    for tp in (1, 2) if world_size == 2 else (2,):
        mesh = init_device_mesh("cpu", (world_size // tp, tp), mesh_dim_names=("dp", "tp"))
        ev = ctx.evaluator(TASKS, strict=True)
        metrics = ev.run(tiny_gpt(), dp_group=mesh)
        out[f"dp{world_size // tp}xtp{tp}"] = {"metrics": metrics, "rows": per_rank(rows(ev))}
        if world_size == 4:
            group = mesh["dp"].get_group()
            out[f"dp{world_size // tp}xtp{tp}_group"] = {
                "metrics": ctx.evaluator(TASKS, strict=True).run(tiny_gpt(), dp_group=group)
            }
    return out


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an op allocates while active: outputs that are views of an input
    (a transposed weight) allocate nothing; a DTensor counts its local shard."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = tree_leaves((args, kwargs))
        storages = {_local(t).untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and _local(t).untyped_storage().data_ptr() not in storages:
                self.largest = max(self.largest, _local(t).numel())
        return out


@contextlib.contextmanager
def recording_scoring(record: list[dict[str, int]]) -> Iterator[None]:
    """While active, the scoring of the layouts a tensor-parallel head returns (hidden states and a head,
    vocabulary-sharded logits) records, per batch, the largest tensor it allocates and the [U, V/TP] bound."""
    originals = {cls: cls.target_logprobs for cls in (ProjectedHead, VocabSharded)}

    def recording(inner: Callable[..., Any]) -> Callable[..., Any]:
        def target_logprobs(outputs: Any, inputs: Any, workspace: Any) -> Any:
            mode = LargestTensor()
            with mode:
                result = inner(outputs, inputs, workspace)
            tp = dist.get_world_size() if dist.is_initialized() else 1
            positions = int(inputs.rows_U.shape[0])
            record.append({"largest": mode.largest, "bound": positions * -(-GPT_VOCAB // tp), "positions": positions})
            return result

        return target_logprobs

    for cls, inner in originals.items():
        cls.target_logprobs = recording(inner)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for cls, inner in originals.items():
            cls.target_logprobs = inner  # type: ignore[method-assign]


def tensor_parallel_gpt(mesh: Any) -> GPT:
    """The tiny GPT with its output head split over the vocabulary, torchtitan's way."""
    model = tiny_gpt()
    plan = {"lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    return parallelize_module(model, mesh, plan)


def check_vocab_tp(ctx: Context) -> dict[str, Any]:
    """The GPT with a vocabulary-sharded head over the whole world (one data-parallel rank), through its
    hidden states and through full-model logits (a DTensor [B, T, V]); the reference at world size 1 is the
    plain GPT. Then the refusals: no data-parallel group, and the world as one."""
    out: dict[str, Any] = {}
    world_size = ctx.world_size
    mesh = init_device_mesh("cpu", (1, world_size), mesh_dim_names=("dp", "tp")) if world_size > 1 else None
    model = tensor_parallel_gpt(mesh["tp"]) if mesh is not None else tiny_gpt()
    for path, wrap in (("hidden", lambda m: m), ("logits", lambda m: LogitsAdapter(m, MAX_LENGTH))):
        record: list[dict[str, int]] = []
        with recording_scoring(record):
            ev = ctx.evaluator(TASKS, strict=True)
            metrics = ev.run(wrap(model), dp_group=mesh)
        out[path] = {"metrics": metrics, "samples": samples(ev), "memory": record}
    if mesh is not None:
        for name, group in (("no_group", None), ("world_group", dist.group.WORLD)):
            try:
                ctx.evaluator(TASKS[:1], strict=True).run(model, dp_group=group)
                out[name] = "ran"
            except ConfigError as exc:
                out[name] = str(exc)
    return out


class Attention(nn.Module):
    """Causal multi-head attention with separate q/k/v projections (torchtitan's names). The heads are counted
    from the projection's width, so a column-parallel projection gives each rank its own."""

    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.head_dim = dim // n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        B, T = x_BTD.shape[:2]
        q, k, v = (
            w(x_BTD).view(B, T, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        return self.wo(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2))


class FeedForward(nn.Module):
    """SwiGLU (torchtitan's names)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x_BTD)) * self.w3(x_BTD))


class LlamaBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.attention = Attention(dim, n_heads)
        self.feed_forward = FeedForward(dim, 2 * dim)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        x_BTD = x_BTD + self.attention(self.attention_norm(x_BTD))
        return x_BTD + self.feed_forward(self.ffn_norm(x_BTD))


class TinyLlama(nn.Module):
    """input ids [B, T] -> logits [B, T, V]: embedding, Llama blocks, RMSNorm, output head (no positional
    encoding: causal attention alone orders the tokens)."""

    def __init__(self, vocab: int = GPT_VOCAB, dim: int = 32, n_layers: int = 2, n_heads: int = 4) -> None:
        super().__init__()
        torch.manual_seed(4321)
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(LlamaBlock(dim, n_heads) for _ in range(n_layers))
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(input_ids)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def torchtitan_plan(model: TinyLlama, mesh: Any) -> TinyLlama:
    """torchtitan's tensor-parallel plan for Llama (its `apply_tp`): column/row-parallel attention and MLP,
    sequence-parallel norms and residual stream, the output head sharded on the vocabulary (loss parallel)."""
    parallelize_module(
        model,
        mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(
                input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False
            ),
        },
    )
    block_plan = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    } | {f"attention.{n}": ColwiseParallel() for n in ("wq", "wk", "wv")}
    block_plan |= {f"feed_forward.{n}": ColwiseParallel() for n in ("w1", "w3")}
    for layer in model.layers:
        parallelize_module(layer, mesh, block_plan)
    return model


def check_torchtitan_plan(ctx: Context) -> dict[str, Any]:
    """TinyLlama under torchtitan's full tensor-parallel plan over the whole world (one data-parallel rank),
    through its DTensor logits [B, T, V] sharded on the vocabulary; rows padded to an even width (sequence
    parallelism splits the positions). The reference at world size 1 is the plain TinyLlama."""
    world_size = ctx.world_size
    model = TinyLlama()
    mesh = None
    if world_size > 1:
        mesh = init_device_mesh("cpu", (1, world_size), mesh_dim_names=("dp", "tp"))
        model = torchtitan_plan(model, mesh["tp"])
    config = EvaluatorConfig(
        evaluators=[dict(e) for e in TASKS],
        data_root=str(ctx.data_root),
        max_length=MAX_LENGTH,
        strict=True,
        pad_to_multiple=2,
    )
    ev = InLoopEvaluator(config, tokenizer=ctx.tokenizer)
    metrics = ev.run(LogitsAdapter(model, MAX_LENGTH), dp_group=mesh)
    return {"metrics": metrics, "samples": samples(ev)}


class VocabSlices(nn.Module):
    """A toy layout the package knows nothing of: the model returns (this rank's contiguous slice of the
    vocabulary's logits [B, T, L], the slice's first token id), the other slices on the other ranks."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids_BT: torch.Tensor) -> tuple[torch.Tensor, int]:
        world_size, rank = dist.get_world_size(), dist.get_rank()
        width = -(-GPT_VOCAB // world_size)
        return self.model(input_ids_BT)[..., rank * width : (rank + 1) * width], rank * width


class VocabSlicesAdapter(ModelAdapter):
    """The adapter of `VocabSlices`: its slices as the package's vocabulary-sharded layout, every rank of the
    world a peer (they must score the same documents)."""

    def __init__(self, model: VocabSlices) -> None:
        super().__init__(model)
        self.max_length, self.vocab_size = MAX_LENGTH, GPT_VOCAB

    @property
    def needs(self) -> AdapterNeeds:
        return AdapterNeeds(peer_groups=(("vocab slices", dist.group.WORLD),))

    def forward(self, inputs: ForwardInputs) -> VocabSharded:
        local_BTL, start = self.model(inputs.input_ids_BT)
        return VocabSharded(local_BTL[inputs.rows_U, inputs.cols_U], start, GPT_VOCAB, dist.group.WORLD)


def check_registered_layout(ctx: Context) -> dict[str, Any]:
    """A layout registered from outside the package (`VocabSlices`, the whole world holding one model's
    vocabulary in slices) scored through `inloop_eval.register_model_family`; at world size 1 the plain model (the
    reference)."""
    if ctx.world_size == 1:
        ev = ctx.evaluator(TASKS, strict=True)
        return {"metrics": ev.run(LogitsAdapter(tiny_gpt(), MAX_LENGTH)), "samples": samples(ev)}
    entry = ModelFamily("vocab slices", lambda m: isinstance(m, VocabSlices), lambda m, _: VocabSlicesAdapter(m))
    register_model_family(entry)
    try:
        ev = ctx.evaluator(TASKS, strict=True)
        mesh = init_device_mesh("cpu", (1, ctx.world_size), mesh_dim_names=("dp", "tp"))
        metrics = ev.run(VocabSlices(tiny_gpt()), dp_group=mesh["dp"])
    finally:
        unregister_model_family(entry.name)
    return {"metrics": metrics, "samples": samples(ev)}


CHECKS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "layouts": check_layouts,
    "vocab_tp": check_vocab_tp,
    "torchtitan_plan": check_torchtitan_plan,
    "registered_layout": check_registered_layout,
    # The pipeline's checks too, so that one launch per world size runs both (processes start once).
    **{f"pipeline_{name}": check for name, check in pipeline_checks.CHECKS.items()},
}


def run_checks(names: list[str], data_root: Path) -> dict[str, Any]:
    """The checks `names` on one context, in this process (world size 1 runs them without torchrun)."""
    ctx = Context(data_root)
    return {name: CHECKS[name](ctx) for name in names}


def main() -> None:
    checks_main(CHECKS, Context)


if __name__ == "__main__":
    main()
