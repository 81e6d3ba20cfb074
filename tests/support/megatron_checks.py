"""Checks of the evaluator on a Megatron-core `GPTModel` (megatron-core 0.16.1 on CPU, gloo), run by torchrun:

    torchrun --nproc_per_node N tests/support/megatron_checks.py --data-root DIR --out DIR --checks a,b

World size 1 runs `reference`: the seeded model trained two steps through Megatron's schedule, its weights saved
to $MEGATRON_WEIGHTS, and the same weights evaluated through the engine's one-process path (a plain callable
returning full logits: no MegatronAdapter); the same for a seeded RoPE model (`ROPE_MODEL`, its weights saved
beside), whose packed figures through `MegatronAdapter` are also taken with the mask rendered dense and block.
The other launches load those weights into each layout (sliced along each parameter's `partition_dim` for TP,
the layers of each pipeline stage by their global number, a tied output layer from the word embeddings) and
evaluate them through `MegatronAdapter`. Every rank writes `<out>/rank<r>.json`; tests/integrations/
test_megatron.py compares them. The perplexity domains are written under $INLOOP_EVAL_HOME.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))

import megatron_cpu  # noqa: E402
from lm_helpers import lm_entry, write_domains  # noqa: E402

megatron_cpu.use_cpu()

from megatron.core import parallel_state, tensor_parallel  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: E402
from megatron.core.transformer import TransformerConfig  # noqa: E402
from megatron.core.transformer.dot_product_attention import DotProductAttention  # noqa: E402
from workers.dist_checks import Context, draw_random_numbers, params_digest, refusal, samples  # noqa: E402
from workers.launch import checks_main  # noqa: E402

import inloop_eval.integrations.megatron.attention as megatron_attention  # noqa: E402
import inloop_eval.integrations.megatron.forward as megatron_forward  # noqa: E402
from inloop_eval.engine.adapter import ForwardInputs  # noqa: E402
from inloop_eval.engine.attention_route import Routing, routed  # noqa: E402
from inloop_eval.engine.tree_attention import TreeMask  # noqa: E402
from inloop_eval.errors import ModelOutputError  # noqa: E402
from inloop_eval.evaluators.config import EvaluatorConfig  # noqa: E402
from inloop_eval.evaluators.orchestrator import InLoopEvaluator  # noqa: E402
from inloop_eval.integrations.megatron.adapter import MegatronAdapter  # noqa: E402

SEQ_LEN = 256  # the model's positions, and the longest request: 5-shot ARC's shots fit, shared by its documents
VOCAB = 50304  # the NeoX tokenizer's 50277 tokens padded to a multiple of 128
LAYERS = 4  # two stages of two, or four virtual stages of one
# A ranked-classification task, a letter-key task (every choice a token at one position), PMI (unconditional
# requests), a 5-shot task (its shots one prefix of its documents' packed rows); limits no data-parallel size
# divides evenly; budgets giving batches of several rows.
TASKS: list[dict[str, Any]] = [
    {"task": "copa", "limit": 7, "batch_tokens": 160},
    {"task": "olmo:arc_easy_rc_5shot", "limit": 3, "batch_tokens": 600},
    {"task": "mmlu_mc", "limit": 5, "batch_tokens": 300},
    {"task": "arc_easy", "limit": 5, "batch_tokens": 200, "metrics": ["acc", "acc_norm", "acc_pmi"]},
]
TRAIN_TASKS: list[dict[str, Any]] = [{"task": "copa", "limit": 4, "batch_tokens": 256}]
# The RoPE model: output weights tied to the word embeddings, 4 query heads over 2 key/value heads (one of each
# per rank at TP=2); seeded, not trained. Its task: a 5-shot task (its shots a kept prefix, its documents' rows
# packed below them).
ROPE_MODEL: dict[str, Any] = {"positions": "rope", "tied": True, "num_attention_heads": 4, "num_query_groups": 2}
ROPE_TASKS: list[dict[str, Any]] = [
    {"task": "olmo:arc_easy_rc_5shot", "limit": 4, "batch_tokens": 300},
]
# Layout name -> (processes, parallel_state sizes, sequence parallel).
LAYOUTS: dict[str, tuple[int, dict[str, int], bool]] = {
    "tp2": (2, {"tensor_model_parallel_size": 2}, False),
    "tp2sp": (2, {"tensor_model_parallel_size": 2}, True),
    "pp2": (2, {"pipeline_model_parallel_size": 2}, False),
    "pp2vp2": (2, {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2}, False),
    "tp2pp2": (4, {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}, True),
    "dp2tp2": (4, {"tensor_model_parallel_size": 2}, False),
}


def build_model(
    sizes: dict[str, int], sequence_parallel: bool, dropout: float = 0.0, positions: str = "learned_absolute",
    tied: bool = False, **config: Any,
) -> list[nn.Module]:
    """This rank's chunks of the seeded GPTModel in the current parallel_state (one per virtual stage), with
    position embeddings `positions`, output weights `tied` to the word embeddings or not, and TransformerConfig
    fields `config`."""
    tp = sizes.get("tensor_model_parallel_size", 1)
    pp = sizes.get("pipeline_model_parallel_size", 1)
    vp = sizes.get("virtual_pipeline_model_parallel_size")
    fields: dict[str, Any] = dict(
        num_layers=LAYERS,
        hidden_size=32,
        num_attention_heads=2,
        ffn_hidden_size=64,
        init_method_std=0.3,  # logits far from uniform: choices' scores far apart compared with rounding
        use_cpu_initialization=True,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp,
        sequence_parallel=sequence_parallel,
        pipeline_dtype=torch.float32,
        batch_p2p_comm=False,
        hidden_dropout=dropout,
        attention_dropout=dropout,
    )
    config = TransformerConfig(**{**fields, **config})
    chunks = []
    for stage in range(vp or 1):
        stage_arg = stage if vp else None
        torch.manual_seed(1234)
        chunks.append(
            GPTModel(
                config,
                megatron_cpu.local_spec(),
                vocab_size=VOCAB,
                max_sequence_length=SEQ_LEN,
                pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage_arg),
                post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage_arg),
                share_embeddings_and_output_weights=tied,
                position_embedding_type=positions,
                vp_stage=stage_arg,
            )
        )
    return chunks


def load_full_weights(chunks: list[nn.Module], full: dict[str, Tensor]) -> None:
    """Copy the one-process weights `full` into this rank's chunks: each tensor-parallel parameter the slice
    of its `partition_dim` this rank holds, each layer by its global number, the last stage's copy of tied
    output weights from the word embeddings."""
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    for chunk in chunks:
        numbers = [layer.layer_number - 1 for layer in chunk.decoder.layers]
        for name, param in chunk.named_parameters():
            local = re.match(r"decoder\.layers\.(\d+)\.", name)
            key = name if local is None else f"decoder.layers.{numbers[int(local[1])]}.{name[local.end():]}"
            if key == "output_layer.weight" and chunk.share_embeddings_and_output_weights:
                key = "embedding.word_embeddings.weight"
            value = full[key]
            if getattr(param, "tensor_model_parallel", False) and tp_size > 1:
                value = value.chunk(tp_size, dim=param.partition_dim)[tp_rank]
            assert value.shape == param.shape, (name, value.shape, param.shape)
            with torch.no_grad():
                param.copy_(value)


def full_logits(gpt: nn.Module) -> Callable[[Tensor], Tensor]:
    """The unsplit model as a plain callable input ids [B, T] -> logits [B, T, V] (the reference path)."""

    def forward(ids_BT: Tensor) -> Tensor:
        position_ids_BT = torch.arange(ids_BT.shape[1]).expand_as(ids_BT)
        mask_11TT = torch.ones(1, 1, ids_BT.shape[1], ids_BT.shape[1], dtype=torch.bool).triu_(1)
        return gpt(ids_BT, position_ids_BT, mask_11TT)

    return forward


def _training_step(data_iterator: Iterator[Tensor], model: nn.Module) -> Any:
    """Megatron's forward step of a training micro-batch [R, 25]: the per-token loss and its reduction."""
    rows = next(data_iterator)
    position_ids, mask = megatron_forward.causal_inputs(rows.shape[0], rows.shape[1] - 1, rows.device)
    loss_BT = model(rows[:, :-1], position_ids, mask, labels=rows[:, 1:])
    return loss_BT, _mean_loss


def _mean_loss(loss_BT: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    return loss_BT.float().mean(), {"loss": loss_BT.detach().float().mean()}


def train_steps(chunks: list[nn.Module], steps: int, optimizer: torch.optim.Optimizer, batches: torch.Generator,
                between: Callable[[int], None] = lambda step: None) -> list[float]:
    """Training steps through Megatron's schedule (2 micro-batches of 2 rows of 24 tokens, drawn from
    `batches`); `between(step)` before each. The losses the last stage sees (0 elsewhere)."""
    losses: list[float] = []
    for step in range(steps):
        between(step)
        ids = torch.randint(0, 50000, (4, 25), generator=batches)
        for chunk in chunks:
            chunk.train()
        iterators = [iter([ids[:2], ids[2:]]) for _ in chunks]
        out = get_forward_backward_func()(
            forward_step_func=_training_step,
            data_iterator=iterators if len(chunks) > 1 else iterators[0],
            model=chunks,
            num_microbatches=2,
            seq_length=24,
            micro_batch_size=2,
            forward_only=False,
        )
        losses.append(float(sum(o["loss"] for o in out)) if out else 0.0)
        sum_sequence_parallel_grads(chunks)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return losses


def sum_sequence_parallel_grads(chunks: list[nn.Module]) -> None:
    """Sum the gradients of sequence-parallel parameters (the norms) over TP, as Megatron's
    `finalize_model_grads` does: each rank saw only its part of the sequence."""
    group = parallel_state.get_tensor_model_parallel_group()
    for chunk in chunks:
        for param in chunk.parameters():
            if getattr(param, "sequence_parallel", False) and param.grad is not None and dist.get_world_size(group) > 1:
                dist.all_reduce(param.grad, group=group)


def evaluator(
    ctx: Context, entries: list[dict[str, Any]], strict: bool = True, attention_mask: str = "auto"
) -> InLoopEvaluator:
    config = EvaluatorConfig(
        evaluators=[dict(e) for e in entries], data_root=str(ctx.data_root), max_length=SEQ_LEN, strict=strict,
        attention_mask=attention_mask,
    )
    return InLoopEvaluator(config, tokenizer=ctx.tokenizer)


def entries(ctx: Context) -> list[dict[str, Any]]:
    """TASKS and one perplexity entry over domain files written once per launch (rank 0, then a barrier)."""
    home = Path(os.environ["INLOOP_EVAL_HOME"])
    if ctx.rank == 0:
        write_domains(home / "domains", ctx.tokenizer)
    dist.barrier()
    files = {"code": home / "domains" / "code", "prose": home / "domains" / "prose.jsonl"}
    files["tiny"] = home / "domains" / "tiny.npy"
    return [*TASKS, lm_entry(files, home / "lm_cache", batch_tokens=300)]


def rope_weights() -> Path:
    """Where the one-process launch saves the RoPE model's weights: beside $MEGATRON_WEIGHTS."""
    return Path(os.environ["MEGATRON_WEIGHTS"]).with_name("gpt_rope.pt")


def check_reference(ctx: Context) -> dict[str, Any]:
    """One process: train two steps, save the weights, evaluate them unsplit through the engine's own path;
    save the seeded RoPE model's weights and evaluate them the same way, and packed through MegatronAdapter
    with the mask rendered dense and block."""
    sizes: dict[str, int] = {}
    with megatron_cpu.model_parallel(**sizes):
        (gpt,) = build_model(sizes, False)
        optimizer = torch.optim.AdamW(gpt.parameters(), lr=1e-2)
        train_steps([gpt], 2, optimizer, torch.Generator().manual_seed(7))
        torch.save({k: p.detach().clone() for k, p in gpt.named_parameters()}, os.environ["MEGATRON_WEIGHTS"])
        gpt.eval()
        ev = evaluator(ctx, entries(ctx))
        reference = {"metrics": ev.run(full_logits(gpt)), "samples": samples(ev)}
        (rope,) = build_model(sizes, False, **ROPE_MODEL)
        torch.save({k: p.detach().clone() for k, p in rope.named_parameters()}, rope_weights())
        rope.eval()
        reference["train_tasks"] = evaluator(ctx, TRAIN_TASKS).run(full_logits(rope))
        ev = evaluator(ctx, ROPE_TASKS)
        reference["rope"] = {"metrics": ev.run(full_logits(rope)), "samples": samples(ev)}
        reference["rope_renderings"] = {}
        for rendering in ("dense", "block"):
            ev = evaluator(ctx, ROPE_TASKS, attention_mask=rendering)
            adapter = CountingAdapter(rope)
            metrics = ev.run(adapter)
            reference["rope_renderings"][rendering] = {
                "metrics": metrics, "samples": samples(ev), "batches": dict(adapter.batches)
            }
    return reference


class LargestAllocation(TorchDispatchMode):
    """The most elements of any tensor an op returns while active."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@contextlib.contextmanager
def scoring_memory(record: list[dict[str, int]]) -> Iterator[None]:
    """Per micro-batch, the largest tensor the last stage's scoring allocates (the model's forward left out)
    and the bound [U, V/TP] (U: the positions the batch reads, V/TP: the width of this rank's logits)."""
    score = megatron_forward.LastStageScores.__call__

    def recording(self: Any, m: int, logits_RTL: Tensor) -> None:
        mode = LargestAllocation()
        with mode:
            score(self, m, logits_RTL)
        record.append({"largest": mode.largest, "bound": int(self.rows_U.shape[0]) * int(logits_RTL.shape[-1]),
                       "width": int(logits_RTL.shape[-1])})

    megatron_forward.LastStageScores.__call__ = recording  # type: ignore[method-assign]
    try:
        yield
    finally:
        megatron_forward.LastStageScores.__call__ = score  # type: ignore[method-assign]


class CountingAdapter(MegatronAdapter):
    """MegatronAdapter counting the batches it is given, the packed ones among them, the kept prefixes and the
    batches after one."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.batches = {"all": 0, "packed": 0, "keeps_prefix": 0, "after_prefix": 0}

    def forward(self, inputs: ForwardInputs) -> Any:
        self.batches["all"] += 1
        self.batches["packed"] += int(inputs.packed)
        self.batches["keeps_prefix"] += int(inputs.keeps_prefix)
        self.batches["after_prefix"] += int(inputs.prefix is not None and not inputs.keeps_prefix)
        return super().forward(inputs)


def evaluate_layout(
    ctx: Context, name: str, evaluators: tuple[InLoopEvaluator, InLoopEvaluator], weights: tuple[dict, dict]
) -> dict[str, Any]:
    """The saved weights in layout `name`, evaluated through MegatronAdapter over Megatron's data-parallel
    group; also the batches it was given, packed or not, and the scoring's largest allocations; and the RoPE
    model's saved weights in the same layout (`rope`: its figures and batches)."""
    _, sizes, sequence_parallel = LAYOUTS[name]
    ev, rope_ev = evaluators
    full, rope_full = weights
    with megatron_cpu.model_parallel(**sizes):
        chunks = build_model(sizes, sequence_parallel)
        load_full_weights(chunks, full)
        adapter = CountingAdapter(chunks if len(chunks) > 1 else chunks[0])
        dp_group = parallel_state.get_data_parallel_group()
        memory: list[dict[str, int]] = []
        with scoring_memory(memory):
            metrics = ev.run(adapter, dp_group=dp_group)
        out: dict[str, Any] = {
            "metrics": metrics,
            "samples": samples(ev),
            "tokens_scored": ev.tokens_forwarded,
            "memory": memory,
            "batches": dict(adapter.batches),
            "ranks": {
                "tp": parallel_state.get_tensor_model_parallel_rank(),
                "pp": parallel_state.get_pipeline_model_parallel_rank(),
                "dp": parallel_state.get_data_parallel_rank(),
            },
        }
        if name in ("tp2", "tp2pp2"):
            out["no_group"] = refusal(lambda: ev.run(adapter))
            out["world_group"] = refusal(lambda: ev.run(adapter, dp_group=dist.group.WORLD))
        chunks = build_model(sizes, sequence_parallel, **ROPE_MODEL)
        load_full_weights(chunks, rope_full)
        adapter = CountingAdapter(chunks if len(chunks) > 1 else chunks[0])
        metrics = rope_ev.run(adapter, dp_group=dp_group)
        out["rope"] = {"metrics": metrics, "samples": samples(rope_ev), "batches": dict(adapter.batches)}
    return out


def check_layouts(ctx: Context) -> dict[str, Any]:
    """Every layout of this world size, one after the other in this launch."""
    weights = torch.load(os.environ["MEGATRON_WEIGHTS"]), torch.load(rope_weights())
    evaluators = evaluator(ctx, entries(ctx)), evaluator(ctx, ROPE_TASKS)
    return {
        name: evaluate_layout(ctx, name, evaluators, weights)
        for name, (n, _, _) in LAYOUTS.items()
        if n == ctx.world_size
    }


def overrides_left(gpt: nn.Module) -> list[str]:
    """The modules of `gpt` holding an instance-level `forward` (an override left behind)."""
    return [name for name, module in gpt.named_modules() if "forward" in module.__dict__]


def check_stage_failure(ctx: Context) -> dict[str, Any]:
    """The RoPE model at PP=2 whose first stage raises in its third forward (a packed micro-batch, routed):
    every rank raises that error (strict), or reports the task failed (not strict), the launch ends, and no
    override is left on either stage."""
    sizes = {"pipeline_model_parallel_size": 2}
    out: dict[str, Any] = {}
    with megatron_cpu.model_parallel(**sizes):
        chunks = build_model(sizes, False, **ROPE_MODEL)
        calls = [0]

        def boom(module: nn.Module, args: Any) -> None:
            calls[0] += 1
            if parallel_state.is_pipeline_first_stage() and calls[0] == 3:
                out["routed_when_raised"] = overrides_left(module)
                raise RuntimeError("boom in the first stage")

        chunks[0].register_forward_pre_hook(boom)
        adapter = MegatronAdapter(chunks[0])
        dp_group = parallel_state.get_data_parallel_group()
        try:
            evaluator(ctx, TASKS[:1]).run(adapter, dp_group=dp_group)
            out["strict"] = None
        except ModelOutputError as exc:
            out["strict"] = str(exc)
        calls[0] = 0
        out["lenient"] = evaluator(ctx, TASKS[:1], strict=False).run(adapter, dp_group=dp_group)
        out["overrides_left"] = overrides_left(chunks[0])
    return out


class UnverifiedCoreAttention(DotProductAttention):
    """A core attention the packed routing was not verified for (as Transformer Engine's would be)."""


def check_refusals(ctx: Context) -> dict[str, Any]:
    """Context parallelism (a model whose config says so: Megatron cannot build one on CPU) is refused; RoPE
    models pack, and models with an attention the routing was not verified for (a sliding window, another core
    attention) are given one request per row (the reason each blocker names, said once per model in the log)."""
    sizes = {"tensor_model_parallel_size": 2}
    with megatron_cpu.model_parallel(**sizes):
        models = {name: build_model(sizes, False, **kw)[0] for name, kw in
                  (("rope", ROPE_MODEL), ("window", {"window_size": (8, 0)}), ("core", {}))}
        models["core"].decoder.layers[1].self_attention.core_attention.__class__ = UnverifiedCoreAttention
        with logged(megatron_attention.log) as lines:
            blockers = {name: MegatronAdapter(gpt).topology.packing_blocker for name, gpt in models.items()}
            MegatronAdapter(models["core"])
        (gpt,) = build_model(sizes, False)
        gpt.config = dataclasses.replace(gpt.config, context_parallel_size=2)
        return {
            "cp": refusal(lambda: MegatronAdapter(gpt)),
            "packing_blockers": blockers,
            "log": lines,
            "interrupted": interrupted_routing(models["rope"]),
        }


def interrupted_routing(gpt: nn.Module) -> dict[str, list[str]]:
    """The overrides `gpt` holds inside its attention route and after a KeyboardInterrupt raised in it."""
    position_ids_RT = torch.arange(4)[None]
    tree = TreeMask(torch.full((1, 4), 4), position_ids_RT)
    held: list[str] = []
    try:
        with routed(gpt, megatron_attention.ROUTE, Routing(tree)):
            held = overrides_left(gpt)
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    return {"inside": held, "after": overrides_left(gpt)}


@contextlib.contextmanager
def logged(logger: logging.Logger) -> Iterator[list[str]]:
    """The lines `logger` writes (at INFO and above) during the body."""
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def train(ctx: Context, sizes: dict[str, int], full: dict[str, Tensor], *, eval_every: int | None) -> dict[str, Any]:
    """Training on from the saved weights, with dropout, through Megatron's schedule, evaluating every
    `eval_every` steps (step 0 included: the saved weights' figures kept). The batches come from their own
    generator; dropout draws from the global RNG, which an evaluation that moved it would change."""
    chunks = build_model(sizes, True, dropout=0.1, **ROPE_MODEL)
    load_full_weights(chunks, full)
    chunks[0].register_forward_pre_hook(draw_random_numbers)
    chunks[0].register_forward_pre_hook(draw_from_rng_tracker)
    params = [p for c in chunks for p in c.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    adapter = MegatronAdapter(chunks)
    ev = evaluator(ctx, TRAIN_TASKS)
    figures: dict[str, float] = {}
    dp_group = parallel_state.get_data_parallel_group()

    def evaluate(step: int) -> None:
        if eval_every is not None and step % eval_every == 0:
            metrics = ev.run(adapter, step=step, dp_group=dp_group)
            figures.update(figures or metrics)

    torch.manual_seed(100)
    losses = train_steps(chunks, 4, optimizer, torch.Generator().manual_seed(11), between=evaluate)
    return {
        "losses": losses,
        "params": [params_digest(c) for c in chunks],
        "rng_tracker": tracker_digest(),
        "metrics": figures,
        "training": all(m.training for c in chunks for m in c.modules()),
    }


def draw_from_rng_tracker(module: nn.Module, args: Any) -> None:
    """A forward pre-hook drawing from Megatron's model-parallel RNG stream, as its dropout does on a GPU, so
    that an evaluation moves the tracker's state and only restoring it keeps training as it was."""
    with tensor_parallel.get_cuda_rng_tracker().fork():
        torch.rand(1, generator=megatron_cpu.TRACKED)


def tracker_digest() -> str:
    """A hash of every state the RNG tracker holds."""
    h = hashlib.sha256()
    for name, state in sorted(tensor_parallel.get_cuda_rng_tracker().get_states().items()):
        h.update(name.encode() + state.numpy().tobytes())
    return h.hexdigest()


def check_training(ctx: Context) -> dict[str, Any]:
    """The RoPE model at TP=2 x PP=2 with sequence parallelism: training ends bit for bit the same with and
    without evaluations."""
    sizes = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}
    full = torch.load(rope_weights())
    with megatron_cpu.model_parallel(**sizes):
        with_eval = train(ctx, sizes, full, eval_every=2)
    with megatron_cpu.model_parallel(**sizes):
        without = train(ctx, sizes, full, eval_every=None)
    return {"with_eval": with_eval, "without": without}


CHECKS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "reference": check_reference,
    "layouts": check_layouts,
    "stage_failure": check_stage_failure,
    "refusals": check_refusals,
    "training": check_training,
}


if __name__ == "__main__":
    checks_main(CHECKS, Context)
