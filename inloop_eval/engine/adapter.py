"""The one seam between the scoring loop and a model: how a model is called, and how what it returns becomes
log p(target) and greedy flags for a planned batch.

What every adapter promises, and `scoring.run_batches` relies on (it has one path for every model):
- `ModelAdapter.forward(inputs)` runs the model on one planned batch and returns `ModelOutputs`; every rank of
  the adapter's peer groups calls it for the same batch, dummies included, in the same order.
- `ModelOutputs.target_logprobs(inputs, workspace)` returns log p(target) [N] (float32) and whether each target
  is the argmax [N], for `inputs.target_N` predicted at the distinct positions `inputs.rows_U, cols_U`
  (target n at position `inputs.position_N[n]`). It checks the logits' width against `inputs.min_vocab` and
  every target, the same way on every rank of a peer group, before any collective of its own, so that every
  peer raises alike or joins. It is skipped for batches without targets (dummies) on every peer alike.
- `ModelAdapter.needs` (`AdapterNeeds`) is declared once by the adapter and honoured by the planner: a width
  every batch must be a multiple of, whether rows may be packed (the model takes a 4D mask and position
  ids), whether it keeps a prefix's keys and values for the batches after it (`SharedPrefix`), and the
  groups of model-parallel peers that must be fed the same documents.
- A kept prefix: a batch with `inputs.keeps_prefix` is one causal row, a prefix every row of the batches
  that follow begins with, of `inputs.prefix.length` tokens and then the padding the planner adds up to the
  adapter's `width_multiple` (after the prefix, never seen by it); the adapter runs it and leaves whatever it
  needs of the prefix's positions (its layers' keys and values) in `inputs.prefix.states`. The batches after it carry the same `inputs.prefix`, position ids from its
  length on, and a mask [B, 1, T, S + T] whose first S columns (the prefix) every real position sees; the
  adapter attends to the kept keys and values there instead of forwarding the prefix again.
- A model that cannot be scored as it is run is refused before any forward, by `refuse_model`, with one
  message shape.

The ways a model returns its outputs are in `engine/outputs/` (full logits, hidden states and a head, logits
sharded on the vocabulary or on the sequence, a pipeline's last stage), one module each; the adapters of the
model families that produce them, and the registry that picks one for a model, are in `engine/adapters/`,
`integrations/olmo_core/adapter.py`, `engine/adapters/pipeline.py` and `engine/families.py`.
Legend: B rows, T time, U distinct positions read, N targets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

import torch
from torch import Tensor, nn
from torch.distributed import ProcessGroup

from inloop_eval.engine.flex_kernel import FlexKernel
from inloop_eval.engine.logprobs import HostTargets
from inloop_eval.engine.tree_attention import TreeMask, causal_tree
from inloop_eval.errors import ConfigError


@dataclass(frozen=True)
class AdapterNeeds:
    """What an adapter needs from the planner.

    width_multiple: every batch's width must be a multiple of this (a sequence split over TP x CP ranks), a
        kept prefix's row included: the planner pads it (`BatchShape.prefix_multiple`), no adapter does.
    packing: rows may be packed: the model takes a boolean attention mask [B, 1, T, T] and position ids [B, T].
    peer_groups: the model-parallel groups, by name, whose ranks hold parts of one model (other than through
        DTensor parameters) and so must be handed the same documents (`distributed.check_data_parallel`).
    prefix_reuse: with packing, the model keeps a prefix's keys and values for the batches after it
        (`SharedPrefix`).
    """

    width_multiple: int = 1
    packing: bool = False
    peer_groups: tuple[tuple[str, ProcessGroup | None], ...] = ()
    prefix_reuse: bool = False


@dataclass
class SharedPrefix:
    """A prefix of `length` tokens forwarded once, and what the adapter kept of it for the batches after it
    (`states`, in the adapter's own form: for a transformer each layer's keys and values, [1, S, ...]).
    Made by the scoring loop for each kept prefix and dropped after its last batch."""

    length: int
    states: Any = None


@dataclass
class ForwardInputs:
    """One planned batch on the model's device.

    input_ids_BT: right-padded token ids.
    rows_U, cols_U: the distinct positions whose logits are read.
    position_N, target_N: target n is predicted by position `position_N[n]` of (rows_U, cols_U).
    tree: a packed batch's mask (None: plain causal rows), compact, rendered as its device takes it
        (`tree_attention.TreeMask`); `attention_mask_B1TT` is its dense rendering.
    position_ids_BT: set for a packed batch only: each token's position (after a kept prefix of S tokens,
        from S on).
    min_vocab: the tokenizer's vocabulary size; logits narrower than it mean the model does not match.
    prefix: the kept prefix this batch's rows begin with (None: none), or the one this batch forwards.
    keeps_prefix: this batch is the prefix (one causal row, no targets): keep its states in `prefix.states`.
    mask_rendering: how masks are rendered for the engine's attention ("dense" or "block", `tree_attention`).
    host_targets: position_N and target_N as planned, on the host (`logprobs.HostTargets`): scoring chunks
        and checks the targets from them without a copy from the device (None: read from it once).
    kernel: what runs a block rendering (`flex_kernel.FlexKernel`: compiled or eager, and its counts).
    """

    input_ids_BT: Tensor
    rows_U: Tensor
    cols_U: Tensor
    position_N: Tensor
    target_N: Tensor
    tree: TreeMask | None = None
    position_ids_BT: Tensor | None = None
    min_vocab: int = 0
    prefix: SharedPrefix | None = None
    keeps_prefix: bool = False
    mask_rendering: str = "dense"
    host_targets: HostTargets | None = None
    kernel: FlexKernel | None = None

    @property
    def packed(self) -> bool:
        return self.tree is not None

    @property
    def attention_mask_B1TT(self) -> Tensor | None:
        """The packed batch's boolean mask [B, 1, T, S + T] (True = may attend; after a kept prefix of S
        tokens its first S columns the prefix), made on first use; None for plain causal rows."""
        return None if self.tree is None else self.tree.dense()

    def tree_or_causal(self) -> TreeMask:
        """The batch's mask for the engine's attention: its tree, or plain causal rows' for an unpacked batch
        (a kept prefix, a plain row) of a model whose attention is routed through the engine's."""
        if self.tree is not None:
            return self.tree
        return self.causal_mask(*self.input_ids_BT.shape)

    def causal_mask(self, rows: int, width: int) -> TreeMask:
        """The mask of plain causal rows [rows, width], rendered as this batch's masks are."""
        return causal_tree(rows, width, self.input_ids_BT.device, self.mask_rendering, self.kernel)


class ModelOutputs(Protocol):
    """What a model returned for one batch, in the form it returned it (`engine/outputs/`)."""

    @property
    def width(self) -> int:
        """The width of the logits (the vocabulary the model scores over)."""
        ...

    def target_logprobs(self, inputs: ForwardInputs, workspace: HeadWorkspace) -> tuple[Tensor, Tensor]:
        """log p(target) [N] (float32) and greedy flags [N] for `inputs.target_N`."""
        ...


class HeadWorkspace:
    """One float32 logits buffer reused across chunks and batches: a fresh [chunk, V] tensor per chunk
    costs as much in page faults as the exponentials computed in it."""

    def __init__(self) -> None:
        self.buffer: Tensor | None = None

    def get(self, rows: int, vocab: int, device: torch.device) -> Tensor:
        buf = self.buffer
        if buf is None or buf.shape[1] != vocab or buf.shape[0] < rows or buf.device != device:
            buf = self.buffer = torch.empty(rows, vocab, dtype=torch.float32, device=device)
        return buf[:rows]


class ModelAdapter:
    """How to call one kind of model. A subclass sets `max_length` and `vocab_size` where it knows them,
    declares `needs`, and implements `forward`.

    max_length: the model's context length (None: unknown, the evaluator's default applies).
    vocab_size: rows of the input embedding, when known: token ids at or beyond it cannot be fed.
    """

    max_length: int | None = None
    vocab_size: int | None = None

    def __init__(self, model: Any) -> None:
        self.model = model
        self._logits_width: int | None = None

    @property
    def needs(self) -> AdapterNeeds:
        """What this adapter needs from the planner; plain causal rows by default."""
        return AdapterNeeds()

    @property
    def device(self) -> torch.device:
        module = self.model if isinstance(self.model, nn.Module) else None
        if module is not None:
            for p in module.parameters():
                return p.device
        return torch.device("cpu")

    def forward(self, inputs: ForwardInputs) -> ModelOutputs:
        """Run the model on one batch; every peer of `needs.peer_groups` calls it for the same batch."""
        raise NotImplementedError

    def tokens_fed(self, inputs: ForwardInputs) -> int:
        """Tokens `forward` sends through the model for `inputs`, padding included."""
        return int(inputs.input_ids_BT.numel())

    def logits_width(self, width: int, tokens: TokenCount) -> int:
        """The width of the model's logits: the bound on token ids for a model whose input embedding is
        unknown. Measured once per adapter by a forward of one row of token 0, `width` wide (the planner's
        width multiple, so that a compiled model sees no new shape); every rank makes it. Its tokens are
        added to `tokens`."""
        if self._logits_width is None:
            ids = torch.zeros((1, max(1, width)), dtype=torch.long, device=self.device)
            zero = torch.zeros(1, dtype=torch.long, device=self.device)
            probe = ForwardInputs(ids, zero, zero, zero, zero)
            outputs = self.forward(probe)
            tokens.add(self.tokens_fed(probe))
            self._logits_width = outputs.width
        return self._logits_width


class TokenCount:
    """Tokens sent through the model during one evaluation, padding and dummies included: made by the
    orchestrator for each run and passed down to what forwards; added to once per forward, so the forwards
    of an evaluation that then failed count too."""

    def __init__(self) -> None:
        self.total = 0

    def add(self, n: int) -> None:
        self.total += int(n)


class ModelRefused(ConfigError):
    """A model, as it is run (its parallelism, its attention), that the evaluator cannot score; raised before
    any forward."""


def refuse_model(what: str, reason: str, fix: str) -> NoReturn:
    """Refuse a model as it is run, in the one shape every refusal has: what, why it cannot be scored, and
    what to do instead."""
    raise ModelRefused(f"evaluator: {what} cannot be evaluated: {reason}; {fix}")


def check_max_length(max_length: int, positions: int | None, model_name: str) -> None:
    """ConfigError when the configured `max_length` is longer than the model's own context (`positions`,
    where its adapter knows it): such an input would index past the position table (on a GPU a device-side
    assert that kills the process), so it is refused before any forward, the same way on every rank."""
    if positions is not None and max_length > positions:
        raise ConfigError(
            f"evaluator: max_length {max_length} is longer than the {positions} positions the model "
            f"{model_name} was built for; set `max_length:` (or --max-length) to at most {positions}, or leave "
            "it unset to use the model's own"
        )
