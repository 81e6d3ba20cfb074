"""How to call a model: from input ids to logits at the positions that predict continuation tokens.

An adapter returns *features* at the selected positions and a *head* turning features into logits, so
that models whose output projection we can reach are projected only where a log-probability is needed.
Adapters with `supports_packing` take a boolean attention mask [B, 1, T, T] (True = may attend) and
position ids [B, T], which lets the planner share one context among several continuations (batching.py).
Legend: B batch, T time, N selected positions, D width, V vocabulary.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed import ProcessGroup
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from inloop_eval.engine.olmo_core_packing import packed_attention, packs
from inloop_eval.engine.sequence_parallel import SequenceShard, olmo_core_layout, positions_to_keep
from inloop_eval.engine.vocab_parallel import select_rows
from inloop_eval.errors import ConfigError, ModelOutputError

Head = Callable[[Tensor], Tensor]

# Hugging Face model types whose logits are exactly lm_head(final hidden state): no soft-capping or
# scaling after the projection, so projecting only the selected positions gives the same numbers.
_HF_PLAIN_HEAD_TYPES = frozenset(
    {"llama", "gpt_neox", "mistral", "qwen2", "qwen3", "olmo", "olmo2", "olmo3", "gpt2", "phi3", "gemma"}
)
# Types whose logits are `cap * tanh(lm_head(h) / cap)` with cap = `config.final_logit_softcapping` (or
# plain when it is unset): the same ops, in the same dtype, on the selected positions only.
_HF_SOFTCAP_HEAD_TYPES = frozenset({"gemma2", "gemma3_text"})

# Hugging Face model types checked (tests/test_scoring_paths.py, transformers 5.24) to take a 4D attention
# mask and position ids and give, for each packed continuation, the numbers of its own unshared row.
HF_PACKING_TYPES = frozenset(
    {"llama", "gpt_neox", "qwen2", "qwen3", "olmo", "olmo2", "gpt2", "phi3", "gemma"}
)
# Attention implementations that apply a 4D mask as given: sdpa takes it boolean, eager additive.
_HF_PACKING_ATTENTION = frozenset({"sdpa", "eager"})


class ModelAdapter:
    """Base adapter. `supports_packing` says the model takes a 4D mask and position ids."""

    supports_packing: bool = False
    # Round every batch's width up to a multiple of this: bucketed shapes, so that a torch.compile'd model
    # recompiles for a few widths rather than for every one. 1 (off) by default.
    pad_to_multiple: int = 1
    # Widths the model itself requires a multiple of (a sequence split over TP x CP ranks); the evaluator
    # pads to the least common multiple of this and its `pad_to_multiple`.
    sequence_multiple: int = 1
    max_length: int | None = None
    # Rows of the input embedding, when known: token ids at or beyond it cannot be fed.
    vocab_size: int | None = None
    # The width of the model's logits once `probe_vocab_size` has measured it.
    probed_vocab_size: int | None = None
    # Tokens that probe forwarded (counted in the evaluator's tokens forwarded).
    tokens_probed: int = 0
    # Tokens `run_batches` sent through the model, padding and dummies included, over the adapter's life;
    # counted per forward, so an evaluation that fails after some forwards still counts them.
    tokens_scored: int = 0
    # An adapter that scores the targets itself (a pipeline, whose logits exist on its last stage only)
    # sets this and implements `target_logprobs` instead of `features`.
    scores_targets: bool = False
    # Groups, by name, over which the model is split other than by DTensor parameters (a pipeline's stages):
    # the data-parallel group must hold one rank of each (`distributed.check_data_parallel`).
    model_parallel_groups: tuple[tuple[str, ProcessGroup | None], ...] = ()

    def __init__(self, model: Any) -> None:
        self.model = model

    @property
    def device(self) -> torch.device:
        module = self.model if isinstance(self.model, nn.Module) else None
        if module is not None:
            for p in module.parameters():
                return p.device
        return torch.device("cpu")

    def features(
        self,
        input_ids_BT: Tensor,
        rows_N: Tensor,
        cols_N: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> tuple[Tensor | SequenceShard, Head]:
        """Features [N, *] at (rows_N, cols_N), and the head mapping features to logits [N, V]; or, for a
        model splitting the sequence over ranks, the logits of the positions this rank holds."""
        raise NotImplementedError

    def target_logprobs(
        self,
        input_ids_BT: Tensor,
        rows_U: Tensor,
        cols_U: Tensor,
        position_N: Tensor,
        target_N: Tensor,
        min_vocab: int = 0,
    ) -> tuple[Tensor, Tensor, int]:
        """For `scores_targets` adapters: log p(target) [N], greedy flags [N] and the tokens forwarded, target
        n predicted by position `position_N[n]` of (rows_U, cols_U)."""
        raise NotImplementedError


def _identity(x: Tensor) -> Tensor:
    return x


class LogitsAdapter(ModelAdapter):
    """Any module or callable mapping input_ids [B, T] to logits [B, T, V] (or an object with `.logits`), or
    to a DTensor of them sharded on the vocabulary (a tensor-parallel head, scored without gathering it).
    A module's vocabulary is the size of its input embedding (`input_embedding_rows`); a plain callable's
    is unknown, and `probe_vocab_size` measures its logits instead."""

    def __init__(self, model: Any, max_length: int | None = None) -> None:
        super().__init__(model)
        self.max_length = max_length
        self.vocab_size = input_embedding_rows(model)

    def features(
        self,
        input_ids_BT: Tensor,
        rows_N: Tensor,
        cols_N: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> tuple[Tensor, Head]:
        out = self.model(input_ids_BT)
        logits_BTV = getattr(out, "logits", out)
        if isinstance(logits_BTV, DTensor) and tuple(logits_BTV.shape[:2]) == tuple(input_ids_BT.shape):
            return select_rows(logits_BTV, rows_N, cols_N)
        if (
            not isinstance(logits_BTV, Tensor)
            or logits_BTV.dim() != 3
            or logits_BTV.shape[:2] != input_ids_BT.shape
        ):
            found = tuple(logits_BTV.shape) if isinstance(logits_BTV, Tensor) else type(logits_BTV).__name__
            raise ModelOutputError(
                f"model output: expected logits of shape [B, T, V] = [{input_ids_BT.shape[0]}, "
                f"{input_ids_BT.shape[1]}, V] (a tensor or an object with .logits), found {found}"
            )
        return logits_BTV[rows_N, cols_N], _identity


class HiddenStatesAdapter(ModelAdapter):
    """A model that takes packed rows and shows its hidden states (the reference GPT, or any module with
    the same three members): `hidden_states(input_ids [B, T], attention_mask bool [B, 1, T, T] or None,
    position_ids [B, T] or None) -> [B, T, D]`, the output head `lm_head` ([N, D] -> [N, V]), and
    `config.max_seq_len`, `config.vocab_size`. The head runs on the selected positions only."""

    supports_packing = True

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.max_length = model.config.max_seq_len
        self.vocab_size = model.config.vocab_size

    def features(
        self,
        input_ids_BT: Tensor,
        rows_N: Tensor,
        cols_N: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> tuple[Tensor, Head]:
        hidden_BTD = self.model.hidden_states(input_ids_BT, attention_mask, position_ids)
        return hidden_BTD[rows_N, cols_N], self.model.lm_head


class HFCausalLMAdapter(ModelAdapter):
    """A Hugging Face causal LM (`AutoModelForCausalLM`)."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        config = model.config
        self.max_length = getattr(config, "max_position_embeddings", None) or getattr(
            config, "n_positions", None
        )
        model_type = getattr(config, "model_type", "")
        cap = getattr(config, "final_logit_softcapping", None)
        self.softcap: float | None = cap if model_type in _HF_SOFTCAP_HEAD_TYPES else None
        self.plain_head = (
            model_type in _HF_PLAIN_HEAD_TYPES and not cap
        ) or model_type in _HF_SOFTCAP_HEAD_TYPES
        self.supports_packing = hf_supports_packing(config)
        self.additive_mask = getattr(config, "_attn_implementation", None) == "eager"
        self.vocab_size = model.get_input_embeddings().num_embeddings

    def features(
        self,
        input_ids_BT: Tensor,
        rows_N: Tensor,
        cols_N: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> tuple[Tensor, Head]:
        kwargs: dict[str, Tensor] = {}
        if attention_mask is not None:
            if self.additive_mask:  # eager attention adds the mask to the scores
                dtype = self.model.dtype
                zeros = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)
                attention_mask = zeros.masked_fill_(~attention_mask, torch.finfo(dtype).min)
            kwargs["attention_mask"] = attention_mask
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        if self.plain_head:
            base = self.model.base_model
            hidden_BTD = base(input_ids=input_ids_BT, use_cache=False, **kwargs).last_hidden_state
            head = self.model.get_output_embeddings()
            if self.softcap:
                head = SoftCappedHead(head, self.softcap)
            return hidden_BTD[rows_N, cols_N], head
        logits_BTV = self.model(input_ids=input_ids_BT, use_cache=False, **kwargs).logits
        return logits_BTV[rows_N, cols_N], _identity


class OLMoCoreAdapter(ModelAdapter):
    """An OLMo-core `Transformer` (`olmo_core.nn.transformer`), called through `__call__` so that FSDP's hooks
    run. Its forward takes `logits_to_keep` [B, K] (positions per row), so the output head projects only
    the positions read. Its forward ignores an attention mask and position ids, so packed rows run inside
    `packed_attention` (olmo_core_packing.py), which gives its attention both; a model that module was not
    verified for (`packing_refusal`: flash backends, MoE, ...) is scored one request per row, said once in
    the log. With tensor or (Ulysses) context parallelism applied, each rank scores the positions it holds
    (`sequence_parallel`), its batches padded to a multiple of TP x CP, never packed.

    max_length: the context length it was trained at (the train module's `max_sequence_length`); the model
        does not record it, and RoPE would run past it without complaint.
    """

    def __init__(self, model: Any, max_length: int) -> None:
        super().__init__(model)
        self.max_length = max_length
        self.vocab_size = int(model.vocab_size)
        self.keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.layout = olmo_core_layout(model)
        if self.layout is not None:
            self.sequence_multiple = self.layout.multiple
            self.model_parallel_groups = tuple(self.layout.groups())
        self.supports_packing = self.layout is None and packs(model)

    def features(
        self,
        input_ids_BT: Tensor,
        rows_N: Tensor,
        cols_N: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> tuple[Tensor | SequenceShard, Head]:
        packed = self._packed(input_ids_BT, attention_mask, position_ids)
        if self.layout is not None:
            return self.layout.features(self.model, input_ids_BT, rows_N, cols_N), _identity
        if not self.keeps_logits:
            with packed:
                logits_BTV = self.model(input_ids_BT)
            _check_logits(logits_BTV, input_ids_BT.shape[0], input_ids_BT.shape[1])
            return logits_BTV[rows_N, cols_N], _identity
        keep_BK, slot_N = positions_to_keep(rows_N, cols_N, input_ids_BT.shape[0])
        with packed:
            logits_BKV = self.model(input_ids_BT, logits_to_keep=keep_BK)
        _check_logits(logits_BKV, keep_BK.shape[0], keep_BK.shape[1])
        return logits_BKV[rows_N, slot_N], _identity

    def _packed(
        self, input_ids_BT: Tensor, attention_mask: Tensor | None, position_ids: Tensor | None
    ) -> AbstractContextManager[None]:
        """The context a forward of this batch runs in: `packed_attention` for a packed batch."""
        if attention_mask is None and position_ids is None:
            return nullcontext()
        B, T = input_ids_BT.shape
        if not self.supports_packing:
            raise ValueError(
                f"OLMoCoreAdapter: packed rows were planned for {type(self.model).__name__}, which is scored "
                "one request per row (see the log); plan with packing=adapter.supports_packing"
            )
        if (
            attention_mask is None
            or position_ids is None
            or tuple(attention_mask.shape) != (B, 1, T, T)
            or tuple(position_ids.shape) != (B, T)
        ):
            found = [None if x is None else tuple(x.shape) for x in (attention_mask, position_ids)]
            raise ValueError(
                f"OLMoCoreAdapter: a packed batch of input ids {(B, T)} needs an attention mask {(B, 1, T, T)} "
                f"and position ids {(B, T)}, found {found[0]} and {found[1]}"
            )
        return packed_attention(self.model, attention_mask, position_ids)


def _check_logits(logits_BXV: Any, n_rows: int, n_positions: int) -> None:
    """ModelOutputError unless `logits_BXV` is a tensor [n_rows, n_positions, V]."""
    if (
        not isinstance(logits_BXV, Tensor)
        or logits_BXV.dim() != 3
        or tuple(logits_BXV.shape[:2]) != (n_rows, n_positions)
    ):
        found = tuple(logits_BXV.shape) if isinstance(logits_BXV, Tensor) else type(logits_BXV).__name__
        raise ModelOutputError(
            f"OLMo-core model output: expected logits of shape [{n_rows}, {n_positions}, V], found {found}"
        )


class SoftCappedHead:
    """`cap * tanh(head(x) / cap)`, in the order and dtype Gemma 2 and 3 apply it to their logits."""

    def __init__(self, head: Head, cap: float) -> None:
        self.head = head
        self.cap = cap

    def __call__(self, x: Tensor) -> Tensor:
        return torch.tanh(self.head(x) / self.cap) * self.cap


def input_embedding_rows(model: Any) -> int | None:
    """The number of token ids `model` can embed: the rows of `get_input_embeddings()` where the model has
    one, else of its first `nn.Embedding` (in registration order the token embedding, ahead of position
    embeddings, in the common GPT layouts); None for a callable that is not a module."""
    get = getattr(model, "get_input_embeddings", None)
    try:
        embedding = get() if callable(get) else None
    except NotImplementedError:  # Hugging Face's base class, for a model that does not say
        embedding = None
    if embedding is None and isinstance(model, nn.Module):
        embedding = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    rows = getattr(embedding, "num_embeddings", None)
    return rows if isinstance(rows, int) else None


def probe_vocab_size(adapter: ModelAdapter) -> int:
    """The width of the model's logits: the bound on token ids for a model whose input embedding is
    unknown. Measured once per adapter by a forward of one row of token 0 (every rank makes it), as wide as
    `pad_to_multiple` so that a compiled model sees no new shape."""
    if adapter.probed_vocab_size is None:
        width = max(1, min(adapter.pad_to_multiple, adapter.max_length or adapter.pad_to_multiple))
        ids = torch.zeros((1, width), dtype=torch.long, device=adapter.device)
        zero = torch.zeros(1, dtype=torch.long, device=adapter.device)
        features, head = adapter.features(ids, zero, zero)
        adapter.probed_vocab_size = int(head(features).shape[-1])
        adapter.tokens_probed += ids.numel()
    return adapter.probed_vocab_size


def hf_supports_packing(config: Any) -> bool:
    """Whether a Hugging Face model of this config may be fed packed rows: a verified model type, an
    attention implementation that applies a 4D mask as given, and no sliding window (which a custom mask
    would silently replace)."""
    return (
        getattr(config, "model_type", "") in HF_PACKING_TYPES
        and getattr(config, "_attn_implementation", None) in _HF_PACKING_ATTENTION
        and getattr(config, "sliding_window", None) is None
    )


def unwrap(model: Any) -> Any:
    """The module to evaluate: DDP's `.module`, torch.compile's original module."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model, nn.Module):
            model = model._orig_mod
        else:
            return model


def make_adapter(model: Any, max_length: int | None = None) -> ModelAdapter:
    """Pick the adapter for `model`: an adapter as is, an OLMo-core Transformer (`max_length` required), a
    Hugging Face causal LM, a model that shows its hidden states (`HiddenStatesAdapter`: the reference GPT),
    or any callable returning logits. Other FSDP2 modules are called through `__call__` (logits), keeping what the
    adapter for their type knows (context length, vocabulary): their hooks unshard the parameters and
    lazily initialise the root, which reaching past `forward` would skip."""
    if isinstance(model, ModelAdapter):
        return model
    model = unwrap(model)
    if _is_olmo_core_transformer(model):
        if max_length is None:
            raise ConfigError(
                f"evaluator: the OLMo-core model {type(model).__name__} does not record the context length "
                "it was trained at; set `max_length:` in the evaluator config to the train module's "
                "max_sequence_length (the OLMo-core callback, inloop_eval.integrations.olmo_core, reads it)"
            )
        # Called through __call__ already: FSDP2's hooks run, no fallback to plain logits is needed.
        return OLMoCoreAdapter(model, max_length)
    if _is_hf_causal_lm(model):
        adapter: ModelAdapter = HFCausalLMAdapter(model)
    elif _shows_hidden_states(model):
        adapter = HiddenStatesAdapter(model)
    elif callable(model):
        adapter = LogitsAdapter(model, max_length)
    else:
        raise TypeError(
            f"make_adapter: expected a module or callable returning logits, found {type(model).__name__}"
        )
    if max_length is not None:
        check_max_length(max_length, adapter.max_length, type(model).__name__)
        adapter.max_length = max_length
    if _is_fsdp2(model):
        through_hooks = LogitsAdapter(model, adapter.max_length)
        through_hooks.vocab_size = adapter.vocab_size
        return through_hooks
    return adapter


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


def _is_olmo_core_transformer(model: Any) -> bool:
    # Looked up, not imported: a model can be an OLMo-core Transformer only if olmo_core is loaded, and
    # importing it (seconds) for every other model would be waste.
    module = sys.modules.get("olmo_core.nn.transformer.model")
    return module is not None and isinstance(model, module.Transformer)


def _is_fsdp2(model: Any) -> bool:
    return isinstance(model, FSDPModule)


def _shows_hidden_states(model: Any) -> bool:
    config = getattr(model, "config", None)
    return (
        callable(getattr(model, "hidden_states", None))
        and isinstance(getattr(model, "lm_head", None), nn.Module)
        and isinstance(getattr(config, "max_seq_len", None), int)
        and isinstance(getattr(config, "vocab_size", None), int)
    )


def _is_hf_causal_lm(model: Any) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return False
    return isinstance(model, PreTrainedModel) and hasattr(model, "get_output_embeddings")
