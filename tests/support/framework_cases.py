"""The built-in frameworks as the conformance suite (tests/integrations/test_framework_conformance.py) runs them:
one `FrameworkCase` per framework model, each a tiny seeded model, its adapter, its plain forward (the
reference), where its route is seen, a model its route refuses, and what the framework compiles. Adding a
framework to the suite is one more entry in `CASES` (its route: `integrations/<framework>/attention.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import megatron_cpu
import torch
import torch.distributed as dist
import torchtitan_cpu
from flash_on_cpu import flash_kernel
from hf_models import tiny_hf_model
from megatron_checks import ROPE_MODEL, UnverifiedCoreAttention, build_model, full_logits
from olmo_core.nn.attention.backend import TorchAttentionBackend
from olmo_core_models import olmo3_flash_model, olmo_core_model, torch_backend_twin
from torch import Tensor, nn
from torchtitan.models.common.rope import ComplexRoPE

from inloop_eval.engine.adapter import ModelAdapter
from inloop_eval.engine.families import make_adapter
from inloop_eval.integrations.hf.attention import ATTENTION_NAME
from inloop_eval.integrations.megatron.adapter import MegatronAdapter
from inloop_eval.integrations.torchtitan.adapter import TorchTitanAdapter
from inloop_eval.models.gpt import GPT, GPTConfig

torchtitan_cpu.use_cpu()
megatron_cpu.use_cpu()

# The context length every case's model is scored at (Megatron's tiny model has 256 positions).
MAX_LENGTH = 256


@dataclass(frozen=True)
class FrameworkCase:
    """One framework model of the conformance suite.

    name: the case's test id.
    build: the seeded model in eval mode (the same weights at every call), with `dropout` in training where
        the framework has it.
    adapter: the adapter the evaluator makes for it.
    logits: its plain forward, token ids [B, T] -> logits [B, T, V] (training's loss; the reference's).
    twin: the model the reference is computed on (the same weights on kernels this CPU runs without gradient).
    last_block: the module a test hooks to raise inside the forward.
    route_on: whether the model's route is in place now (None: no route, it takes a mask and positions).
    refused: a model its route refuses, and the module path the refusal names (None: it refuses none).
    compiled: the modules the framework compiles for training (`Module.compile`), none where it does not.
    world: what its models are built and run within (Megatron's model-parallel state, flash-attention's kernel).
    schedule_attributes: instance attributes the framework's own schedule sets on its modules in every run,
        training's too (Megatron's `current_microbatch`).
    """

    name: str
    build: Callable[..., nn.Module]
    adapter: Callable[[nn.Module], ModelAdapter]
    logits: Callable[[nn.Module, Tensor], Tensor]
    last_block: Callable[[nn.Module], nn.Module]
    route_on: Callable[[nn.Module], bool] | None
    twin: Callable[[nn.Module], nn.Module] = lambda model: model
    refused: Callable[[], tuple[nn.Module, str]] | None = None
    compiled: Callable[[nn.Module], Iterable[nn.Module]] = lambda model: ()
    world: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext
    schedule_attributes: tuple[str, ...] = ()


def overrides_on(model: nn.Module) -> bool:
    """Whether any module of `model` forwards through an instance-level override."""
    return any("forward" in m.__dict__ for m in model.modules())


def called(model: nn.Module, ids_BT: Tensor) -> Tensor:
    """A model called on token ids alone."""
    return model(ids_BT)


# OLMo-core: the olmo2 shape on the torch backend, and OLMo 3 on flash-attention 2 built on CPU.


class UserBackend(TorchAttentionBackend):
    """A user's own attention backend: what its forward does was never seen."""


def olmo_core_refused() -> tuple[nn.Module, str]:
    model = olmo_core_model("llama")
    attention = model.blocks["1"].attention
    attention.backend = UserBackend(head_dim=attention.head_dim, n_heads=attention.n_heads)
    return model, "'blocks.1.attention'"


def olmo_core_case(name: str, build: Callable[..., nn.Module], **how: Any) -> FrameworkCase:
    """OLMo-core's route (the refused model is the torch backend's: a refused flash model would run flash's
    kernel, which this CPU has not)."""
    return FrameworkCase(
        name, build, lambda model: make_adapter(model, MAX_LENGTH), called,
        last_block=lambda model: list(model.blocks.values())[-1], route_on=overrides_on, refused=olmo_core_refused,
        compiled=lambda model: model.blocks.values(), **how,
    )  # fmt: skip


# Hugging Face: the engine's attention set as each config's implementation for one forward.


def hf_case(model_type: str) -> FrameworkCase:
    return FrameworkCase(
        f"hf-{model_type}",
        build=lambda dropout=0.0: tiny_hf_model(model_type, attention_dropout=dropout),
        adapter=lambda model: make_adapter(model, MAX_LENGTH),
        logits=lambda model, ids_BT: model(input_ids=ids_BT, use_cache=False).logits,
        last_block=lambda model: model.model.layers[-1],
        route_on=lambda model: model.config._attn_implementation == ATTENTION_NAME,
    )


# torchtitan: llama3 and qwen3 shapes on causal SDPA (no dropout: the training check draws from torch's RNG).


def torchtitan_adapter(model: nn.Module) -> ModelAdapter:
    return TorchTitanAdapter(model, forward=model, max_length=MAX_LENGTH)


class UserRoPE(ComplexRoPE):
    """A user's own rotary embedding: what its forward does was never seen."""


def torchtitan_refused() -> tuple[nn.Module, str]:
    model = torchtitan_cpu.tiny_decoder("llama3")
    model.layers["1"].attention.rope.__class__ = UserRoPE
    return model, "'layers.1.attention'"


def torchtitan_case(family: str) -> FrameworkCase:
    return FrameworkCase(
        f"torchtitan-{family}", lambda dropout=0.0: torchtitan_cpu.tiny_decoder(family), torchtitan_adapter,
        called, last_block=lambda model: list(model.layers.values())[-1], route_on=overrides_on,
        refused=torchtitan_refused, compiled=lambda model: model.layers.values(),
    )  # fmt: skip


# Megatron: a GPTModel with RoPE (tied output weights, grouped-query attention) in one process's parallel state.


@contextlib.contextmanager
def megatron_world() -> Iterator[None]:
    """A one-process gloo world and Megatron's model-parallel state of size one, for the body (as it is where
    one is open already)."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with megatron_cpu.model_parallel():
            yield
    finally:
        dist.destroy_process_group()


def megatron_model(dropout: float = 0.0, **config: Any) -> nn.Module:
    (gpt,) = build_model({}, False, dropout=dropout, **{**ROPE_MODEL, **config})
    return gpt.eval()


def megatron_logits(gpt: nn.Module, ids_BT: Tensor) -> Tensor:
    return full_logits(gpt)(ids_BT)


def megatron_adapter(gpt: nn.Module) -> ModelAdapter:
    return MegatronAdapter(gpt)


def megatron_refused() -> tuple[nn.Module, str]:
    gpt = megatron_model()
    gpt.decoder.layers[1].self_attention.core_attention.__class__ = UnverifiedCoreAttention
    return gpt, "'decoder.layers.1.self_attention.core_attention'"


MEGATRON = FrameworkCase(
    "megatron-gpt-rope", megatron_model, megatron_adapter, megatron_logits,
    last_block=lambda gpt: gpt.decoder.layers[-1], route_on=overrides_on, refused=megatron_refused,
    world=megatron_world, schedule_attributes=("current_microbatch",),
)  # fmt: skip


# The reference GPT takes a mask and positions: no route.


def gpt_model(dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    return GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, dropout=dropout)).eval()


REFERENCE_GPT = FrameworkCase(
    "reference-gpt", gpt_model, lambda model: make_adapter(model, MAX_LENGTH), called,
    last_block=lambda model: model.blocks[-1], route_on=None,
)  # fmt: skip


CASES = [
    olmo_core_case("olmo-core-torch", lambda dropout=None: olmo_core_model("olmo2", dropout)),
    olmo_core_case(
        "olmo-core-flash2",
        lambda dropout=None: olmo3_flash_model(dropout=dropout),
        twin=torch_backend_twin,
        world=flash_kernel,
    ),
    hf_case("llama"),
    hf_case("qwen2"),
    hf_case("mistral"),
    torchtitan_case("llama3"),
    torchtitan_case("qwen3"),
    MEGATRON,
    REFERENCE_GPT,
]
