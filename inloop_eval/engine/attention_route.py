"""One routine routes a framework's attention through the engine's for the length of one forward; each framework
that packs rows declares what it routes, once, as an `AttentionRoute`.

What a route declares (`integrations/<framework>/attention.py`, one `ROUTE` each):
- `framework`: the words a log line names a refused model by (before its class name);
- `refusal(model)`: why the model is not routed, naming the module path of what was not verified (None: it
  is); a refused model is scored one request per row, said once per model in the route's `log` (`packs`);
- `sites(model)`: the modules whose `forward` is swapped for one forward, each with its override (`Override`,
  called with the module, the forward's `Routing` and the call's arguments): a RoPE module rotating at
  `Routing.position_ids_BT`, a core attention handing its queries, keys and values to `Routing.attend`.

What the routine promises (`routed(model, route, routing)`): during the body every site forwards through its
override, an instance attribute, so `__call__` and every hook (FSDP2's included) still run, and the modules
of `model` compiled with `Module.compile` run uncompiled (no compiled graph traces an override, and training
never recompiles); on exit every instance attribute is as it was, whether the body returns, raises or is
interrupted (KeyboardInterrupt included). Parameters, buffers, hooks and classes are never touched.

`Routing` is what one forward runs under: the batch's `TreeMask` (each token's position with it), the kept
prefix it reads, and where the prefix it forwards is recorded. `Routing.attend` is the one call every routed
core attention makes: it records a prefix's keys and values, puts a kept prefix's before the rows' own and
attends through `tree_attention`, so the kept-prefix bookkeeping is here once. `routing_for(adapter, inputs,
packing)`: the routing of one planned batch (None: not routed). For a route's checks of what it verified:
`own_class(module)` (the class a module was written as, under the wrapper classes torch swaps in, FSDP2's),
`first_refusal(model, refusal_at)` (the first module refused, by path), `split_dimensions(model)`.
Legend: B rows, T time, S a kept prefix's length, K keys (S + T), H query heads, G key/value heads, D head
width.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from inloop_eval.distributed import model_parallel_dims
from inloop_eval.engine.adapter import ForwardInputs, ModelAdapter
from inloop_eval.engine.tree_attention import NO_WINDOW, TreeMask, tree_attention

# A kept prefix's keys and values [1, G, S, D] (after RoPE, before GQA's repetition), by the site that made them.
KeptKeysValues = dict[nn.Module, tuple[Tensor, Tensor]]
# Models whose refusal was logged already: one line per model, not one per adapter or evaluation.
_REPORTED: weakref.WeakSet[nn.Module] = weakref.WeakSet()
_MISSING = object()


@dataclass
class Routing:
    """What one forward is routed under.

    tree: the batch's mask (its keys S + T, S the kept prefix's) and each token's position.
    kept: the kept prefix's keys and values this batch reads, by site (None: no prefix).
    record: where this forward, a prefix's row, records each site's keys and values (None: it does not).
    record_length: the positions recorded (the rest of the row is padding; None: all).
    max_positions: the longest RoPE table a site may ask for (the model's context length; None: any).
    originals: each site's own forward (its instance `forward` where it has one), for an override that calls it.
    """

    tree: TreeMask
    kept: KeptKeysValues | None = None
    record: KeptKeysValues | None = None
    record_length: int | None = None
    max_positions: int | None = None
    originals: dict[nn.Module, Callable[..., Any]] = field(default_factory=dict, repr=False)

    @property
    def position_ids_BT(self) -> Tensor:
        return self.tree.position_ids_BT

    @property
    def rope_positions(self) -> int:
        """The positions a RoPE table must cover: every key's, at most `max_positions`."""
        keys = self.tree.keys
        return keys if self.max_positions is None else min(keys, self.max_positions)

    def attend(
        self,
        site: nn.Module,
        q_BHTD: Tensor,
        k_BGTD: Tensor,
        v_BGTD: Tensor,
        scale: float | None = None,
        window: tuple[int, int] = NO_WINDOW,
    ) -> Tensor:
        """The attention [B, H, T, D] of `site` (a core attention): its keys and values recorded (row 0's
        first `record_length` positions) where a prefix is kept, the kept prefix's before its own where one
        is read, then `tree_attention` under the batch's mask."""
        if self.record is not None:
            self.record[site] = (k_BGTD[:1, :, : self.record_length], v_BGTD[:1, :, : self.record_length])
        if self.kept is not None:
            k_1GSD, v_1GSD = self.kept[site]
            B = q_BHTD.shape[0]
            k_BGTD = torch.cat([k_1GSD.expand(B, -1, -1, -1), k_BGTD], dim=2)
            v_BGTD = torch.cat([v_1GSD.expand(B, -1, -1, -1), v_BGTD], dim=2)
        return tree_attention(q_BHTD, k_BGTD, v_BGTD, self.tree, scale=scale, window=window)


# A site's override, called as `override(module, routing, *args, **kwargs)` in place of `module(*args, **kwargs)`'s
# forward during a routed forward.
Override = Callable[..., Any]


@dataclass(frozen=True)
class AttentionRoute:
    """What one framework routes (see the module docstring): `framework` names a refused model in `log`,
    `refusal(model)` says why one is not routed (None: it is), `sites(model)` the modules and their
    overrides."""

    framework: str
    log: logging.Logger
    refusal: Callable[[nn.Module], str | None]
    sites: Callable[[nn.Module], Iterable[tuple[nn.Module, Override]]]


def own_class(module: nn.Module) -> type:
    """The module's class under the wrapper classes torch swaps in (FSDP2's `FSDP<name>`, `replicate`'s): the
    first class of its MRO defined outside torch."""
    return next(c for c in type(module).__mro__ if not c.__module__.startswith("torch."))


def first_refusal(model: nn.Module, refusal_at: Callable[[Any, str], str | None]) -> str | None:
    """The first refusal `refusal_at(module, path)` gives over the modules of `model`, in order, or None."""
    return next((r for path, m in model.named_modules() if (r := refusal_at(m, path)) is not None), None)


def split_dimensions(model: nn.Module) -> list[str]:
    """The names of the model-parallel mesh dimensions `model`'s parameters are split over, sorted."""
    return sorted(
        {(mesh.mesh_dim_names or ("unnamed",) * mesh.ndim)[d] for mesh, d in model_parallel_dims(model)}
    )


def packs(route: AttentionRoute, model: nn.Module) -> bool:
    """Whether `route` routes `model`; when it does not, one log line per model says why (`report_refusal`)."""
    refusal = route.refusal(model)
    if refusal is not None:
        report_refusal(route, model, refusal)
    return refusal is None


def report_refusal(route: AttentionRoute, model: nn.Module, refusal: str) -> None:
    """Log, once per `model`, that its requests go one per row and why."""
    if model not in _REPORTED:
        _REPORTED.add(model)
        route.log.info(
            "%s %s: scoring one request per row, no shared contexts: %s",
            route.framework,
            type(model).__name__,
            refusal,
        )


@contextmanager
def routed(model: nn.Module, route: AttentionRoute, routing: Routing | None) -> Iterator[None]:
    """During the body, every site of `route` in `model` forwards as `routing` says and the compiled modules
    of `model` run uncompiled; on exit all is as it was (see the module docstring). `routing` None: the model
    as it is."""
    if routing is None:
        yield
        return
    overrides = {module: partial(override, module, routing) for module, override in route.sites(model)}
    routing.originals = {m: m.__dict__.get("forward") or partial(type(m).forward, m) for m in overrides}
    with overridden_forwards(model, overrides):
        yield


@contextmanager
def overridden_forwards(
    model: nn.Module, overrides: Mapping[nn.Module, Callable[..., Any]]
) -> Iterator[None]:
    """During the body, each module of `overrides` forwards through its override and the compiled modules of
    `model` run uncompiled; on exit every instance `forward` and compiled call is as it was."""
    compiled = [m for m in model.modules() if m._compiled_call_impl is not None]
    saved_forward = [(m, m.__dict__.get("forward", _MISSING)) for m in overrides]
    saved_compiled = [(m, m._compiled_call_impl) for m in compiled]
    try:
        for module, forward in overrides.items():
            module.forward = forward
        for module in compiled:
            module._compiled_call_impl = None
        yield
    finally:
        for module, impl in saved_compiled:
            module._compiled_call_impl = impl
        for module, forward in saved_forward:
            if forward is _MISSING:
                del module.__dict__["forward"]
            else:
                module.__dict__["forward"] = forward


def unverified(framework: str, what: str) -> RuntimeError:
    """The error of a routed site called with arguments its route was not verified with."""
    return RuntimeError(f"packed {framework} forward: {what}, which the packed rows were not verified with")


def routing_for(
    adapter: ModelAdapter, inputs: ForwardInputs, packing: bool, max_positions: int | None = None
) -> Routing | None:
    """The routing of one planned batch of a model whose every forward is routed (`packing`: `batch_routing`),
    or None for one scored one request per row (ValueError for packed rows planned for it)."""
    if packing:
        return batch_routing(adapter, inputs, max_positions)
    if inputs.packed or inputs.prefix is not None:
        raise ValueError(
            f"{type(adapter).__name__}: packed rows were planned for {type(adapter.model).__name__}, which is "
            "scored one request per row (see the log); plan with the adapter's needs.packing"
        )
    return None


def batch_routing(adapter: ModelAdapter, inputs: ForwardInputs, max_positions: int | None = None) -> Routing:
    """The routing of one planned batch: a kept prefix's one causal row, recording its first `prefix.length`
    positions (the rest is the padding a split sequence needs) in `inputs.prefix.states`; a packed batch under
    its tree after the kept prefix it reads; plain rows causal, so that no forward of an evaluation runs the
    model's own kernel. ValueError for a mask that does not fit the batch."""
    prefix, (B, T) = inputs.prefix, inputs.input_ids_BT.shape
    if inputs.keeps_prefix and prefix is not None:
        prefix.states = {}
        return Routing(inputs.causal_mask(1, T), None, prefix.states, prefix.length, max_positions)
    tree = inputs.tree_or_causal()
    S = prefix.length if prefix is not None else 0
    found = (tuple(tree.span_end_BT.shape), tree.prefix_length, tuple(tree.position_ids_BT.shape))
    if found != ((B, T), S, (B, T)):
        raise ValueError(
            f"{type(adapter).__name__}: a batch of input ids {(B, T)} after a kept prefix of {S} tokens needs a "
            f"mask of span ends {(B, T)}, prefix length {S} and position ids {(B, T)}, found {found}"
        )
    return Routing(tree, None if prefix is None else prefix.states, max_positions=max_positions)
