"""Checks of the evaluator under a real process group, run by torchrun (or in-process for world size 1).

    torchrun --nproc_per_node N tests/support/workers/dist_checks.py --data-root DIR --out DIR --checks a,b,c

Every rank writes `<out>/rank<r>.json`: check name -> JSON-able result. tests/test_distributed.py compares
the results of world sizes 1..4. Each process group is created with a timeout, so a collective that never
matches fails the run instead of hanging it.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import inloop_eval.evaluators.downstream as downstream_module
from inloop_eval.data.root import home, neox_tokenizer_path
from inloop_eval.data.tokenizer import Tokenizer, load_tokenizer
from inloop_eval.distributed import TaskFailedOnAnotherRank, world
from inloop_eval.engine.adapters.logits import LogitsAdapter
from inloop_eval.engine.families import make_adapter
from inloop_eval.engine.outputs.full_logits import FullLogits
from inloop_eval.errors import ConfigError, ModelOutputError, TaskDataError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.integrations.olmo_core.adapter import OLMoCoreAdapter
from inloop_eval.integrations.olmo_core.attention import packing_refusal
from inloop_eval.models.gpt import GPT, GPTConfig
from inloop_eval.requests.cache import cache_dir, load_table, save_table
from inloop_eval.requests.table import build_requests
from inloop_eval.tasks import get_task, load_docs
from workers import lm_world_sizes
from workers.launch import checks_main

MAX_LENGTH = 512
# Real tasks; limits that no world size divides evenly, a task with fewer documents than ranks, small
# token budgets (many batches, different counts per rank), a subset, and a 5-shot task (its documents share
# their shots: below a kept prefix at world sizes 1 and 2, in tree rows at 4, as the cost model takes them).
METRIC_TASKS: list[dict[str, Any]] = [
    {"task": "copa", "limit": 13, "batch_tokens": 96},
    {"task": "olmo:arc_easy_rc_5shot", "label": "arc_easy_5shot", "limit": 23, "batch_tokens": 1024},
    {"task": "arc_challenge", "limit": 11, "batch_tokens": 128},
    {"task": "mmlu_mc", "limit": 10, "batch_tokens": 256},
    {"task": "copa", "label": "copa_two", "limit": 2},
    {
        "task": "arc_easy",
        "label": "arc_easy_subset",
        "limit": 30,
        "batch_tokens": 200,
        "subset_num_batches": 3,
    },
]
# The sharded-model checks go through full logits (FSDP2 modules are called through __call__).
SHARDED_TASKS: list[dict[str, Any]] = [
    {"task": "copa", "limit": 13, "batch_tokens": 96},
    {"task": "mmlu_mc", "limit": 10, "batch_tokens": 128},
]
# Packed rows for OLMo-core models: rc tasks whose contexts several continuations share, a 5-shot context.
OLMO_CORE_TASKS: list[dict[str, Any]] = [
    {"task": "hellaswag", "limit": 5, "batch_tokens": 512},
    {"task": "olmo:arc_easy_rc_5shot", "limit": 5, "batch_tokens": 1024},
]
HEALTHY = {"task": "copa", "limit": 4, "batch_tokens": 64}
FAILING = {"task": "arc_challenge", "label": "boom", "limit": 11, "batch_tokens": 64}


def tiny_gpt(dropout: float = 0.0) -> GPT:
    """The same seeded model on every rank."""
    torch.manual_seed(1234)
    return GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=MAX_LENGTH, dropout=dropout))


class Context:
    def __init__(self, data_root: Path) -> None:
        self.data_root = data_root
        self.tokenizer = load_tokenizer(neox_tokenizer_path(data_root))
        self.world_size, self.rank = world()

    def evaluator(
        self, evaluators: list[dict[str, Any]], *, strict: bool = False, tokenizer: Any = None
    ) -> InLoopEvaluator:
        config = EvaluatorConfig(
            evaluators=[dict(e) for e in evaluators],
            data_root=str(self.data_root),
            max_length=MAX_LENGTH,
            strict=strict,
        )
        return InLoopEvaluator(config, tokenizer=tokenizer or self.tokenizer)


def samples(ev: InLoopEvaluator) -> list[dict[str, Any]]:
    """This rank's per-request scores: (task, doc, choice) -> loglikelihood, unconditional one, greedy flag."""
    keys = ("task", "doc_id", "cont_id", "ll", "ll_uncond", "is_greedy")
    return [{k: s[k] for k in keys} for s in ev.samples()]


def refusal(run: Callable[[], Any]) -> str:
    """The ConfigError `run` raised, or 'not refused'."""
    try:
        run()
    except ConfigError as exc:
        return str(exc)
    return "not refused"


class CountingTokenizer:
    """The real tokenizer, counting `encode` calls (the request cache should spare them)."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner = inner
        self.calls = 0
        self.bos_token_id, self.eos_token_id = inner.bos_token_id, inner.eos_token_id
        self.fingerprint = inner.fingerprint
        self.vocab_size = inner.vocab_size

    def encode(self, text: str) -> list[int]:
        self.calls += 1
        return self.inner.encode(text)


class ShardedHeadLM(nn.Module):
    """A model whose forward makes real collectives: each rank holds a slice of the output head's rows
    and every forward all-gathers them (a hand-made FSDP), then all-reduces a scale (exactly 1). A rank
    making fewer forward calls than the others would leave them waiting in a collective."""

    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.gpt = gpt
        world_size, rank = world()
        self.head_shard = nn.Parameter(gpt.lm_head.weight.detach().chunk(world_size)[rank].clone())
        self.calls = 0

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        hidden_BTD = self.gpt.hidden_states(input_ids)
        world_size, _ = world()
        shards = [torch.empty_like(self.head_shard) for _ in range(world_size)]
        scale = torch.ones(1)
        if world_size > 1:
            dist.all_gather(shards, self.head_shard.contiguous())
            dist.all_reduce(scale)
        else:
            shards = [self.head_shard]
        return (hidden_BTD @ torch.cat(shards).T) * (scale / world_size)


def fsdp_gpt(dropout: float = 0.0) -> nn.Module:
    """The tiny GPT under FSDP2 (`fully_shard` on every block and the root)."""
    from torch.distributed.fsdp import fully_shard

    model = tiny_gpt(dropout)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def forward_counter(model: nn.Module) -> list[int]:
    count = [0]
    model.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    return count


def per_rank(value: Any) -> list[Any]:
    """`value` from every rank (rank order)."""
    world_size, _ = world()
    if world_size == 1:
        return [value]
    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, value)
    return out


def tokens_forwarded(ev: InLoopEvaluator) -> dict[str, int]:
    """Each evaluator's tokens forwarded on this rank (those of its scores), by name."""
    return {name: evaluator_tokens(out.detail) for name, out in ev.last_outputs.items() if out.detail is not None}


def evaluator_tokens(detail: Any) -> int:
    """The tokens a downstream task's (`TaskResult.scores`) or an lm entry's (`DomainsResult`) scores forwarded."""
    return int(detail.scores.tokens_forwarded if hasattr(detail, "scores") else detail.tokens_forwarded)


# ---- checks -------------------------------------------------------------------------------------------


def check_cache(ctx: Context) -> dict[str, Any]:
    """Rank 0 tokenizes and writes the request cache, the others read it; a second evaluator (a restart)
    reads it on every rank. Run first, on an empty cache."""
    tasks = [{"task": "piqa", "limit": 7}, {"task": "mmlu_mc", "label": "mmlu_cached", "limit": 5}]
    first = CountingTokenizer(ctx.tokenizer)
    out_first = ctx.evaluator(tasks, strict=True, tokenizer=first).run(tiny_gpt())
    second = CountingTokenizer(ctx.tokenizer)
    out_second = ctx.evaluator(tasks, strict=True, tokenizer=second).run(tiny_gpt())
    return {
        "encode_calls": per_rank([first.calls, second.calls]),
        "same_metrics": out_first == out_second,
        # Only this check's tasks: rank 0 may already be writing the next check's files.
        "files": sorted(p.name for p in cache_dir().iterdir() if p.name.startswith(("piqa-", "mmlu_mc-"))),
    }


def check_metrics(ctx: Context) -> dict[str, Any]:
    ev = ctx.evaluator(METRIC_TASKS, strict=True)
    out = ev.run(tiny_gpt())
    return {"metrics": out, "tokens_forwarded": per_rank(tokens_forwarded(ev))}


def check_collective(ctx: Context) -> dict[str, Any]:
    """All-gather inside forward; world size 1 gives the plain full-logits numbers."""
    model = ShardedHeadLM(tiny_gpt())
    ev = ctx.evaluator(SHARDED_TASKS, strict=True)
    out = ev.run(LogitsAdapter(model, max_length=MAX_LENGTH))
    return {
        "metrics": out,
        "calls": per_rank(model.calls),
        "tokens_forwarded": per_rank(tokens_forwarded(ev)),
    }


def check_fsdp(ctx: Context) -> dict[str, Any]:
    """FSDP2 at world size > 1 (handed over as is); the plain model through full logits at world size 1."""
    if ctx.world_size == 1:
        model: nn.Module = tiny_gpt()
        calls = forward_counter(model)
        out = ctx.evaluator(SHARDED_TASKS, strict=True).run(LogitsAdapter(model, max_length=MAX_LENGTH))
        return {"metrics": out, "calls": [calls[0]]}
    model = fsdp_gpt()
    calls = forward_counter(model)
    ev = ctx.evaluator(SHARDED_TASKS, strict=True)
    out = ev.run(model)
    return {"metrics": out, "calls": per_rank(calls[0]), "tokens_forwarded": per_rank(tokens_forwarded(ev))}


def tiny_olmo_core() -> nn.Module:
    """A seeded OLMo-core Transformer of the olmo2 shape (reordered norms, QK norm, GQA), the same on every
    rank, its RoPE tables warmed to MAX_LENGTH as a train module warms them."""
    from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig

    config = TransformerConfig.llama_like(
        d_model=32, vocab_size=50304, n_layers=2, n_heads=4, n_kv_heads=2, qk_norm=True,
        block_name=TransformerBlockType.reordered_norm, hidden_size_multiple_of=16,
    )  # fmt: skip
    torch.manual_seed(1234)
    model = config.build(init_device="cpu")
    model.init_weights(max_seq_len=MAX_LENGTH, device=torch.device("cpu"))
    return model


def check_olmo_core_fsdp(ctx: Context) -> dict[str, Any]:
    """An OLMo-core Transformer under its own `apply_fsdp` (FSDP2 on every block and the root, a "dp" mesh)
    at world size > 1, handed over as is: packed rows. World size 1: the plain model, one request per row."""
    from torch.distributed.device_mesh import init_device_mesh

    model = tiny_olmo_core()
    if ctx.world_size == 1:
        adapter = OLMoCoreAdapter(model, MAX_LENGTH)
        adapter.packing = False
        ev = ctx.evaluator(OLMO_CORE_TASKS, strict=True)
        return {"metrics": ev.run(adapter), "packs": [False], "tokens_forwarded": [tokens_forwarded(ev)]}
    model.apply_fsdp(dp_mesh=init_device_mesh("cpu", (ctx.world_size,), mesh_dim_names=("dp",)))
    calls = forward_counter(model)
    ev = ctx.evaluator(OLMO_CORE_TASKS, strict=True)
    out = ev.run(model)
    return {
        "metrics": out,
        "packs": per_rank(make_adapter(model, MAX_LENGTH).needs.packing),
        "calls": per_rank(calls[0]),
        "tokens_forwarded": per_rank(tokens_forwarded(ev)),
    }


def check_olmo_core_tp(ctx: Context) -> dict[str, Any]:
    """An OLMo-core Transformer under its own `apply_tp` over every rank (a "tp" mesh): its figures packed,
    whether it packs, and why the single-device adapter's check would refuse it."""
    from torch.distributed.device_mesh import init_device_mesh

    model = tiny_olmo_core()
    mesh = init_device_mesh("cpu", (1, ctx.world_size), mesh_dim_names=("dp", "tp"))
    model.apply_tp(mesh["tp"])
    ev = ctx.evaluator(OLMO_CORE_TASKS, strict=True)
    return {
        "metrics": ev.run(model, dp_group=mesh["dp"]),
        "packs": make_adapter(model, MAX_LENGTH).needs.packing,
        "refusal": packing_refusal(model),
        "tokens_forwarded": tokens_forwarded(ev),
    }


@contextmanager
def patched(module: Any, name: str, replacement: Any) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)


def raise_on_rank(rank: int, at_call: int, exc: Exception, wrapped: Callable[..., Any]) -> Callable[..., Any]:
    """`wrapped`, except that on `rank` its `at_call`-th call raises `exc`."""
    calls = [0]

    def fn(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if world()[1] == rank and calls[0] == at_call:
            raise exc
        return wrapped(*args, **kwargs)

    return fn


def check_failures(ctx: Context) -> dict[str, Any]:
    """A task that raises on the last rank only, at several stages; the next task must still run. At world
    size 1 nothing is injected: the healthy task's reference numbers."""
    tasks = [FAILING, HEALTHY]
    if ctx.world_size == 1:
        plain = ctx.evaluator([HEALTHY], strict=True).run(tiny_gpt())
        logits = ctx.evaluator([HEALTHY], strict=True).run(LogitsAdapter(tiny_gpt(), max_length=MAX_LENGTH))
        return {"healthy_gpt": plain, "healthy_logits": logits}
    last = ctx.world_size - 1
    results: dict[str, Any] = {}

    def load_docs_failing(task: Any, data_root: Any, limit: Any = None, spread: bool = False) -> Any:
        if world()[1] == last and task.name == FAILING["task"]:
            raise TaskDataError(f"task {task.name!r} doc 3: injected data error on rank {last}")
        return load_docs(task, data_root, limit=limit, spread=spread)

    # Preparation: a data error on one rank, before any forward pass (FSDP model).
    with patched(downstream_module, "load_docs", load_docs_failing):
        results["prepare"] = ctx.evaluator(tasks).run(fsdp_gpt())
        # Strict: every rank raises, none hangs.
        try:
            ctx.evaluator(tasks, strict=True).run(fsdp_gpt())
            results["strict"] = "no exception"
        except (TaskDataError, TaskFailedOnAnotherRank) as exc:
            results["strict"] = f"{type(exc).__name__}: {exc}"

    # Scoring a batch, between forward passes, on a model whose forward all-gathers (FSDP2).
    # An FSDP2 module is called through __call__, so its outputs are full logits.
    failing_logprobs = raise_on_rank(
        last, 2, ModelOutputError("injected scoring error"), FullLogits.target_logprobs
    )
    with patched(FullLogits, "target_logprobs", failing_logprobs):
        results["scoring_fsdp"] = ctx.evaluator(tasks).run(fsdp_gpt())

    # Inside the forward of a model without collectives.
    gpt = tiny_gpt()
    failing_forward = raise_on_rank(last, 3, RuntimeError("injected forward error"), gpt)
    results["forward_plain"] = ctx.evaluator(tasks).run(LogitsAdapter(failing_forward, max_length=MAX_LENGTH))
    return {name: per_rank(value) for name, value in results.items()}


def check_cache_race(ctx: Context) -> dict[str, Any]:
    """Every rank writes and reads the same cache file at once, many times: no read may see a partial
    file (each write is a temporary file renamed into place)."""
    task = get_task("hellaswag")
    table = build_requests(task, load_docs(task, str(ctx.data_root), limit=300), ctx.tokenizer, MAX_LENGTH)
    path = cache_dir() / "race.npz"
    expected = hashlib.sha256(table.pairs.ctx_tokens.tobytes() + table.cont_id.tobytes()).hexdigest()
    reads, bad = 0, []
    dist.barrier()
    for i in range(40):
        if (i + ctx.rank) % 2 == 0:
            save_table(table, path)
        for _ in range(3):
            loaded = load_table(path)
            if loaded is None:
                continue
            reads += 1
            got = hashlib.sha256(loaded.pairs.ctx_tokens.tobytes() + loaded.cont_id.tobytes()).hexdigest()
            if got != expected or loaded.context_text != table.context_text:
                bad.append(i)
    dist.barrier()
    leftovers = sorted(p.name for p in path.parent.iterdir() if p.name.endswith(".tmp"))
    return {"reads": per_rank(reads), "bad": per_rank(bad), "leftover_tmp": leftovers}


def params_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(name.encode() + full.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def draw_random_numbers(module: nn.Module, args: Any) -> None:
    """A forward pre-hook drawing from the torch, NumPy and Python RNGs (as sampling layers do), so that
    evaluation moves every stream and only restoring them keeps training as it was."""
    torch.rand(1)
    np.random.rand()
    random.random()


def train(ctx: Context, model: nn.Module, *, eval_every: int | None, steps: int = 6) -> str:
    """Seeded training with dropout; in-loop eval every `eval_every` steps (step 0 included, before the
    first training forward). Batches are drawn from the global torch RNG, so an eval that moved it would
    change the data as well as the dropout masks."""
    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    inner.register_forward_pre_hook(draw_random_numbers)
    for block in inner.blocks:  # the evaluator calls the blocks even where it skips the root's forward
        block.register_forward_pre_hook(draw_random_numbers)
    evaluator = ctx.evaluator([HEALTHY], strict=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(100 + ctx.rank)
    np.random.seed(7)
    model.train()
    for step in range(steps):
        if eval_every is not None and step % eval_every == 0:
            evaluator.run(model, step=step)
        ids = torch.randint(0, 50000, (4, 24))
        logits = model(ids)
        loss = nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return params_digest(model)


def check_training(ctx: Context) -> dict[str, Any]:
    """DDP and FSDP2 training with dropout end bit-for-bit the same with and without in-loop eval."""
    from torch.nn.parallel import DistributedDataParallel

    out: dict[str, Any] = {}
    out["ddp"] = [
        train(ctx, DistributedDataParallel(tiny_gpt(dropout=0.1)), eval_every=every) for every in (2, None)
    ]
    out["fsdp"] = [train(ctx, fsdp_gpt(dropout=0.1), eval_every=every) for every in (3, None)]
    return out


def check_lm(ctx: Context) -> dict[str, Any]:
    """The `lm` evaluator on the domain files in `$LM_DOMAINS` (tests/support/workers/lm_world_sizes.py), its
    token cache under this launch's empty home."""
    return lm_world_sizes.evaluate(Path(os.environ["LM_DOMAINS"]), home() / "lm_cache", ctx.tokenizer)


CHECKS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "cache": check_cache,
    "metrics": check_metrics,
    "collective": check_collective,
    "fsdp": check_fsdp,
    "failures": check_failures,
    "cache_race": check_cache_race,
    "training": check_training,
    "olmo_core_fsdp": check_olmo_core_fsdp,
    "olmo_core_tp": check_olmo_core_tp,
    "lm": check_lm,
}


def run_checks(names: list[str], data_root: Path) -> dict[str, Any]:
    """The checks `names` on one context, in this process (world size 1 runs them without torchrun)."""
    ctx = Context(data_root)
    return {name: CHECKS[name](ctx) for name in names}


def main() -> None:
    checks_main(CHECKS, Context)


if __name__ == "__main__":
    main()
