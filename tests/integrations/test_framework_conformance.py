"""What every framework's attention route promises, checked on every built-in framework model
(`framework_cases.CASES`: OLMo-core on the torch backend and on flash-attention 2 built on CPU, Hugging Face
llama, qwen2 and mistral, torchtitan llama3 and qwen3, Megatron GPT with RoPE, the reference GPT) and on a toy
framework written here (`TOY`, a tiny model and its `AttentionRoute`):
- packed rows and kept prefixes give every request the loglikelihood (1e-5) and greedy flag of one plain forward
  of its own row, with fewer tokens than one request per row;
- the route is in place during a forward and removed after it, after an exception and after a KeyboardInterrupt
  raised inside it, the model's state and own logits bit for bit as before;
- training (dropout on, the blocks compiled where the framework compiles them) ends bit for bit the same with
  evaluations in between, which compile nothing;
- a model the route refuses is named with its module path, once, and scored one request per row.
Adding a framework: its route (`integrations/<framework>/attention.py`) and one entry in `CASES`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import packing_reference
import pytest
import torch
import torch.nn.functional as F
from framework_cases import CASES, MAX_LENGTH, FrameworkCase, overrides_on
from packing_reference import (
    assert_same_state,
    model_state,
    one_packed_batch,
    packed_plan,
    score,
    task_pairs,
    unpacked_plan,
)
from torch import Tensor, nn

from inloop_eval.engine.adapter import AdapterNeeds, ForwardInputs, ModelAdapter, TokenCount
from inloop_eval.engine.attention_route import (
    AttentionRoute,
    Routing,
    first_refusal,
    packs,
    routed,
    routing_for,
)
from inloop_eval.engine.batching import plan_batches
from inloop_eval.engine.outputs.full_logits import FullLogits
from inloop_eval.engine.scoring import run_batches
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.requests.table import PairSet

# 5-shot rc (its shots a kept prefix) and rc with unconditional requests (PMI), two documents each.
KEPT_SHOTS = "olmo:arc_easy_rc_5shot"
TASKS = (KEPT_SHOTS, "arc_easy")
N_DOCS = 2

pytestmark = pytest.mark.usefixtures("one_thread")


# The toy framework: a pre-norm decoder whose attention rotates queries and keys by column in its own RoPE
# module and hands them to its own core attention module; a soft-capped core attention is what its route
# refuses.


class ToyRope(nn.Module):
    """Rotates queries and keys [B, H, T, D] at `positions_BT` (default: their columns)."""

    def __init__(self, head_width: int) -> None:
        super().__init__()
        self.register_buffer("inv_freq_F", 1.0 / 10000 ** (torch.arange(0, head_width, 2) / head_width))

    def forward(self, q: Tensor, k: Tensor, positions_BT: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if positions_BT is None:
            positions_BT = torch.arange(q.shape[2], device=q.device)[None]
        angles_B1TF = (positions_BT[:, None, :, None] * self.inv_freq_F).float()
        cos, sin = angles_B1TF.cos(), angles_B1TF.sin()

        def rotate(x: Tensor) -> Tensor:
            x1, x2 = x[..., ::2], x[..., 1::2]
            return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)

        return rotate(q), rotate(k)


class ToyCore(nn.Module):
    """Causal attention of queries [B, H, T, D] over keys and values, its scores soft-capped where `softcap`."""

    softcap: float | None = None

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.softcap is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        scores_BHTT = torch.tanh(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 / self.softcap) * self.softcap
        causal_TT = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool, device=q.device).tril()
        return scores_BHTT.masked_fill(~causal_TT, float("-inf")).softmax(-1) @ v


class ToyBlock(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.rope, self.core = ToyRope(width // heads), ToyCore()
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x_BTW: Tensor) -> Tensor:
        B, T, W = x_BTW.shape
        qkv = self.qkv(self.norm1(x_BTW)).view(B, T, 3, self.heads, W // self.heads).permute(2, 0, 3, 1, 4)
        q, k = self.rope(qkv[0], qkv[1])
        attended_BTW = self.core(q, k, qkv[2]).transpose(1, 2).reshape(B, T, W)
        x_BTW = x_BTW + self.dropout(self.out(attended_BTW))
        return x_BTW + self.dropout(self.mlp(self.norm2(x_BTW)))


class ToyLM(nn.Module):
    def __init__(self, vocab: int = 50304, width: int = 32, heads: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(ToyBlock(width, heads, dropout) for _ in range(2))
        self.head = nn.Linear(width, vocab)

    def forward(self, ids_BT: Tensor) -> Tensor:
        x_BTW = self.embed(ids_BT)
        for block in self.blocks:
            x_BTW = block(x_BTW)
        return self.head(x_BTW)


def toy_refusal(model: nn.Module) -> str | None:
    return first_refusal(
        model,
        lambda m, path: f"soft-capped core attention at {path!r}" if getattr(m, "softcap", None) else None,
    )


def toy_rotate(
    rope: ToyRope, routing: Routing, q: Tensor, k: Tensor, positions_BT: Tensor | None = None
) -> Any:
    return routing.originals[rope](q, k, routing.position_ids_BT)


def toy_attend(core: ToyCore, routing: Routing, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return routing.attend(core, q, k, v)


def toy_sites(model: nn.Module) -> Iterator[tuple[nn.Module, Any]]:
    for block in model.blocks:
        yield from ((block.rope, toy_rotate), (block.core, toy_attend))


TOY_ROUTE = AttentionRoute("toy model", logging.getLogger(__name__), toy_refusal, toy_sites)


class ToyAdapter(ModelAdapter):
    """The toy framework's adapter: every forward under its route where the route takes the model."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.max_length, self.vocab_size = MAX_LENGTH, model.embed.num_embeddings
        self.packing = packs(TOY_ROUTE, model)

    @property
    def needs(self) -> AdapterNeeds:
        return AdapterNeeds(packing=self.packing, prefix_reuse=self.packing)

    def forward(self, inputs: ForwardInputs) -> FullLogits:
        with routed(self.model, TOY_ROUTE, routing_for(self, inputs, self.packing)):
            logits_BTV = self.model(inputs.input_ids_BT)
        return FullLogits(logits_BTV[inputs.rows_U, inputs.cols_U])


def toy_model(dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    return ToyLM(dropout=dropout).eval()


def toy_refused() -> tuple[nn.Module, str]:
    model = toy_model()
    model.blocks[1].core.softcap = 5.0
    return model, "'blocks.1.core'"


TOY = FrameworkCase(
    "toy", toy_model, ToyAdapter, lambda model, ids_BT: model(ids_BT), last_block=lambda model: model.blocks[-1],
    route_on=overrides_on, refused=toy_refused,
)  # fmt: skip
EVERY_CASE = [*CASES, TOY]


@pytest.fixture(scope="module", params=EVERY_CASE, ids=lambda case: case.name)
def case(request: pytest.FixtureRequest) -> Iterator[FrameworkCase]:
    """Each framework case, within its world for the length of its tests."""
    with request.param.world():
        yield request.param


@pytest.fixture(scope="module")
def requests(data_root, neox_tokenizer) -> dict[str, tuple[PairSet, np.ndarray]]:
    return task_pairs(TASKS, data_root, neox_tokenizer, N_DOCS, MAX_LENGTH)


def reference(case: FrameworkCase, model: nn.Module, pairs: PairSet, ids: np.ndarray) -> tuple:
    """One plain forward per request over its own row, on the case's twin of `model`."""
    twin = case.twin(model)
    return packing_reference.reference_scores(lambda x, n: case.logits(twin, x)[0, -n:], pairs, ids)


def test_packed_and_kept_prefix_figures_equal_one_request_per_row(case, requests):
    model = case.build()
    adapter = case.adapter(model)
    assert adapter.needs.packing and adapter.needs.prefix_reuse, case.name
    for task, (pairs, ids) in requests.items():
        ref_ll, ref_greedy = reference(case, model, pairs, ids)
        paths = {
            "packed": score(adapter, pairs, ids, **packed_plan(max_length=MAX_LENGTH)),
            "kept prefixes": score(adapter, pairs, ids, **packed_plan(True, max_length=MAX_LENGTH)),
            "one request per row": score(adapter, pairs, ids, **unpacked_plan(MAX_LENGTH)),
        }
        for name, found in paths.items():
            where = f"{case.name} {task}: {name}"
            np.testing.assert_allclose(found.ll, ref_ll, atol=1e-5, rtol=0, err_msg=where)
            np.testing.assert_array_equal(found.greedy, ref_greedy, err_msg=where)
        assert paths["packed"].tokens_forwarded < paths["one request per row"].tokens_forwarded, task
    pairs, ids = requests[KEPT_SHOTS]
    assert any(b.keeps_prefix for b in plan_batches(pairs, ids, **packed_plan(True, max_length=MAX_LENGTH)))


def test_the_route_is_removed_after_a_forward_an_exception_and_an_interrupt(case, requests):
    model = case.build()
    ids_BT = torch.randint(0, 50000, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.enable_grad():  # the model's own kernels, as in training
        logits = case.logits(model, ids_BT).detach()
    before = model_state(model, case.schedule_attributes)
    pairs, pair_ids = requests[KEPT_SHOTS]
    plan = packed_plan(True, max_length=MAX_LENGTH)
    score(case.adapter(model), pairs, pair_ids, **plan)
    assert_same_state(before, model_state(model, case.schedule_attributes))
    batches = plan_batches(pairs, pair_ids, **plan)
    first_kept = next(i for i, b in enumerate(batches) if b.keeps_prefix)
    seen: list[bool] = []
    for raised in (RuntimeError("boom inside the forward"), KeyboardInterrupt()):

        def fail(module: nn.Module, args: object, output: object, raised: BaseException = raised) -> None:
            seen.append(case.route_on is None or case.route_on(model))
            raise raised

        hook = case.last_block(model).register_forward_hook(fail)
        expected = KeyboardInterrupt if isinstance(raised, KeyboardInterrupt) else Exception
        with pytest.raises(expected), torch.no_grad():
            run_batches(case.adapter(model), batches[first_kept:], len(pair_ids), TokenCount())
        hook.remove()
        assert_same_state(before, model_state(model, case.schedule_attributes))
        assert case.route_on is None or not case.route_on(model)
    assert seen == [True, True], "the route is in place inside the forward"
    with torch.enable_grad():
        assert torch.equal(case.logits(model, ids_BT), logits)


def train(case: FrameworkCase, evaluator: InLoopEvaluator | None, steps: int = 4) -> tuple[list[Tensor], int]:
    """Seeded AdamW steps with dropout on random tokens drawn from torch's global generator after each step's
    evaluation (when given), the blocks compiled as the framework compiles them (a backend counting graphs);
    the parameters after the last step and the graphs compiled."""
    model = case.build(dropout=0.1).train()
    graphs: list[int] = []

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(1)
        return gm.forward

    compiled_blocks = list(case.compiled(model))
    for block in compiled_blocks:
        block.compile(backend=counting_backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(1)
    for step in range(steps):
        if evaluator is not None and step % 2 == 1:
            compiled = len(graphs)
            evaluator.run(case.adapter(model), step=step)
            assert len(graphs) == compiled, f"{case.name}: the evaluation compiled a graph"
        ids_BT = torch.randint(0, 50000, (2, 17))
        logits_BTV = case.logits(model, ids_BT[:, :-1])
        F.cross_entropy(logits_BTV.flatten(0, 1).float(), ids_BT[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert bool(graphs) == bool(compiled_blocks), f"{case.name}: {len(graphs)} graphs of compiled blocks"
    return [p.detach().clone() for p in model.parameters()], len(graphs)


def test_training_is_bit_identical_with_evaluations_in_between(case, data_root, neox_tokenizer):
    config = EvaluatorConfig(
        evaluators=[{"task": KEPT_SHOTS, "limit": N_DOCS}], data_root=str(data_root), strict=True,
        max_length=MAX_LENGTH,
    )  # fmt: skip
    (with_evaluations, graphs), (without, graphs_without) = (
        train(case, InLoopEvaluator(config, tokenizer=neox_tokenizer)),
        train(case, None),
    )
    assert graphs == graphs_without, "training recompiled after an evaluation"
    for p, q in zip(with_evaluations, without, strict=True):
        assert torch.equal(p, q), case.name


@pytest.mark.parametrize("refusing", [c for c in EVERY_CASE if c.refused is not None], ids=lambda c: c.name)
def test_a_refused_model_is_named_with_its_module_path_and_scored_one_request_per_row(
    refusing, requests, caplog
):
    with refusing.world():
        model, path = refusing.refused()
        with caplog.at_level(logging.INFO):
            adapters = [refusing.adapter(model) for _ in range(3)]
        lines = [r.getMessage() for r in caplog.records if path in r.getMessage()]
        assert len(lines) == 1 and "scoring one request per row" in lines[0], lines
        assert not any(a.needs.packing or a.needs.prefix_reuse for a in adapters)
        pairs, ids = requests[KEPT_SHOTS]
        found = score(adapters[0], pairs, ids, **unpacked_plan(MAX_LENGTH))
        ref_ll, ref_greedy = reference(refusing, model, pairs, ids)
        np.testing.assert_allclose(found.ll, ref_ll, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(found.greedy, ref_greedy)
        with pytest.raises(ValueError, match="plan with the adapter's needs.packing"):
            run_batches(adapters[0], [one_packed_batch()], 2, TokenCount())
