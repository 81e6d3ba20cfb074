"""Loading one checkpoint's model, per format, and the vocabulary the checkpoint records.

- Hugging Face: `AutoModelForCausalLM.from_pretrained` (float32; sharded safetensors through their index),
  each safetensors file read whole into memory rather than mapped (`disable_mmap`): a file truncated while
  mapped (rewritten in place) would kill the process with SIGBUS, a short read only fails the load. The cost
  is one file's bytes beside the model while it loads. A tensor the files lack, or of another shape than the
  config's model, is refused naming it and its file (`CheckpointDamaged`, tried again when the files
  change), never initialised at random.
- OLMo-core: the model built from the checkpoint's `config.json` (OLMo-core's `ConfigSaverCallback` saves the
  experiment config there: its `model` entry is a `TransformerConfig`), or by `model_builder`; its weights
  read with torch.distributed.checkpoint from `model_and_optim/` through OLMo-core's
  `load_model_and_optim_state` with no optimizer, so no optimizer state is read.
- torchtitan: the model built by `model_builder` (torchtitan saves no model config), its weights read with
  `torch.distributed.checkpoint.load` into its own state dict: only the model's keys, not the optimizer's,
  the data loader's or the train state's.

`model_builder` is `module:function`, a callable taking no argument and returning the `nn.Module` to load
the weights into, or a config that builds it: torchtitan's trainer config (a function of its
`config_registry`, e.g. `torchtitan.models.llama3.config_registry:llama3_debugmodel`, whose
`model_spec.model.build()` is called) or any object with `build()`.

In a sharded layout (`layout`: `--tp`, `--fsdp`) the OLMo-core or torchtitan model is built on the meta
device and parallelised by its framework (`integrations/<framework>/layout.py`), its shards allocated, and
its weights read with `torch.distributed.checkpoint.load` through `ShardReader`: each rank reads only the
slices of the tensors it holds, whatever layout the checkpoint was saved in (DCP reshards).

A Hugging Face checkpoint with `--fsdp` is built FSDP2-sharded by `integrations/hf/layout.py`, each rank
reading only the rows of the safetensors tensors it holds (`--tp` is refused there).

Every model is returned in eval mode on `device`, one at a time: the watcher drops it before the next.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from tokenizers import Tokenizer
from torch import nn

from inloop_eval.errors import ConfigError
from inloop_eval.watch.completion import CONFIG_FILE, HF_INDEX, HF_SINGLE, OLMO_CORE_WEIGHTS
from inloop_eval.watch.discovery import HF, OLMO_CORE, TORCHTITAN, Checkpoint, CheckpointDamaged
from inloop_eval.watch.layout import ParallelLayout
from inloop_eval.watch.shard_reads import ShardRead, ShardReader

TOKENIZER_CONFIG_CLASS = "olmo_core.data.tokenizer.TokenizerConfig"
# Each format's build in a sharded layout, `(spec, layout, device) -> (model, scored, dp_group)`, by import
# path: its integration imports its framework, which only a checkpoint of that format needs.
SHARDED_BUILDERS = {
    OLMO_CORE: "inloop_eval.integrations.olmo_core.layout:build_in_layout",
    TORCHTITAN: "inloop_eval.integrations.torchtitan.layout:build_in_layout",
}
# A Hugging Face model in a layout (`--fsdp`), read from its safetensors shard by shard.
HF_SHARDED_LOADER = "inloop_eval.integrations.hf.layout:load_in_layout"
# What an OLMo-core trainer state needs beyond tensors: NumPy arrays (the reconstructor, whatever module
# this NumPy keeps it in) and their dtypes.
NUMPY_GLOBALS = [
    np.ndarray(0).__reduce__()[0],
    np.ndarray,
    np.dtype,
    *{type(np.dtype(name)) for name in ("uint32", "int64", "float64", "bool")},
]


def resolve_builder(spec: str) -> Callable[[], Any]:
    """The callable `module:function` names; ConfigError when it cannot be imported."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(
            f"watch: model_builder {spec!r} is not `module:function`, e.g. "
            "torchtitan.models.llama3.config_registry:llama3_debugmodel"
        )
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"watch: model_builder {spec!r} cannot be imported ({exc}); check the name"
        ) from exc
    if not callable(target):
        raise ConfigError(f"watch: model_builder {spec!r} is {type(target).__name__}, not a callable")
    return target


def build_from(spec: str) -> nn.Module:
    """The module `model_builder` gives, built on the CPU with its buffers initialised."""
    made = resolve_builder(spec)()
    if not isinstance(made, nn.Module):
        model_spec = getattr(made, "model_spec", None)
        if model_spec is not None:  # torchtitan's trainer config
            made = model_spec.model.build()
        elif callable(getattr(made, "build", None)):
            made = made.build()
    if not isinstance(made, nn.Module):
        raise ConfigError(
            f"watch: model_builder {spec!r} returned {type(made).__name__}; expected an nn.Module, "
            "torchtitan's trainer config or a config with build()"
        )
    init = getattr(made, "init_weights", None)
    if callable(init):  # buffers no checkpoint holds (torchtitan's rotary tables)
        with torch.no_grad():
            try:
                init(buffer_device=None)
            except TypeError:
                init()
    return made


def olmo_core_model_config(checkpoint: Checkpoint) -> Any:
    """OLMo-core's `TransformerConfig` from the checkpoint's `config.json` (its `model` entry, or the whole
    file when it is a model config itself)."""
    from olmo_core.nn.transformer import TransformerConfig

    path = checkpoint.path / CONFIG_FILE
    data = json.loads(path.read_text())
    entry = data.get("model", data) if isinstance(data, dict) else None
    if not isinstance(entry, dict) or "d_model" not in entry:
        raise ConfigError(
            f"watch: {path} holds no OLMo-core model config (expected a `model` entry with `d_model`, as "
            "OLMo-core's ConfigSaverCallback saves the experiment config); pass --model-builder module:function"
        )
    return TransformerConfig.from_dict(entry)


def require_builder(checkpoint: Checkpoint, model_builder: str | None) -> None:
    """ConfigError for a checkpoint of a format that holds no model config (torchtitan) and no `model_builder`."""
    if checkpoint.format == TORCHTITAN and not model_builder:
        raise ConfigError(
            f"watch: {checkpoint.path} is a torchtitan checkpoint, which holds no model config; pass "
            "--model-builder module:function (e.g. your torchtitan config_registry function)"
        )


@dataclass
class LoadedModel:
    """One checkpoint's model as the watcher scores it: `model` (the module: its vocabulary is checked),
    `scored` (what the evaluator is given: the module, or its adapter in a layout that needs one),
    `dp_group` (what the documents are sharded over: None, the world, when every rank holds the whole
    model), `reads` (what this rank read of a sharded checkpoint; empty for a whole-model load) and `whole`
    (the bytes of those tensors whole, as one process reads them)."""

    model: nn.Module
    scored: Any
    dp_group: Any = None
    reads: list[ShardRead] = field(default_factory=list)
    whole: int = 0


def load_model(
    checkpoint: Checkpoint,
    device: torch.device,
    model_builder: str | None = None,
    layout: ParallelLayout | None = None,
) -> LoadedModel:
    """The checkpoint's model with its weights, in eval mode on `device`: whole on every rank, or in
    `layout` when it is sharded (each rank reading only its share)."""
    if layout is not None and layout.sharded:
        return load_sharded(checkpoint, device, model_builder, layout)
    if checkpoint.format == HF:
        return whole_model(load_hf(checkpoint.path).to(device).eval())
    if checkpoint.format == OLMO_CORE:
        from olmo_core.distributed.checkpoint import load_model_and_optim_state

        if model_builder:
            model = build_from(model_builder)
        else:
            model = olmo_core_model_config(checkpoint).build(init_device="cpu")
        load_model_and_optim_state(str(checkpoint.path / OLMO_CORE_WEIGHTS), model)
        return whole_model(model.to(device).eval())
    if checkpoint.format == TORCHTITAN:
        require_builder(checkpoint, model_builder)
        model = build_from(str(model_builder))
        state = model.state_dict()
        dcp.load(state, checkpoint_id=str(checkpoint.path))
        model.load_state_dict(state)
        return whole_model(model.to(device).eval())
    raise ValueError(f"unknown checkpoint format {checkpoint.format!r}")


def whole_model(model: nn.Module) -> LoadedModel:
    return LoadedModel(model=model, scored=model)


def load_sharded(
    checkpoint: Checkpoint, device: torch.device, model_builder: str | None, layout: ParallelLayout
) -> LoadedModel:
    """The checkpoint's model built in `layout` by its framework's integration (OLMo-core, torchtitan), its
    weights read through torch.distributed.checkpoint into each rank's shards by `ShardReader`: only the
    model's entries, each rank only the slices it holds."""
    if checkpoint.format == HF:
        load_in_layout = resolve_builder(HF_SHARDED_LOADER)
        model, dp_group, reads, whole = load_in_layout(checkpoint.path, layout, device)
        return LoadedModel(model=model, scored=model, dp_group=dp_group, reads=reads, whole=whole)
    if checkpoint.format not in SHARDED_BUILDERS:
        raise ConfigError(
            f"watch: {checkpoint.path} is a {checkpoint.format} checkpoint, which --tp/--fsdp do not load "
            "sharded yet (Hugging Face with --fsdp, OLMo-core and torchtitan); run the watcher without them"
        )
    # The model's spec first: a torchtitan builder may set torchtitan up (its device) before the
    # integration imports torchtitan's modules.
    spec = sharded_model_spec(checkpoint, model_builder)
    model, scored, dp_group = resolve_builder(SHARDED_BUILDERS[checkpoint.format])(spec, layout, device)
    # The module's own state dict (its local shards as DTensors; torchtitan's hooks split its fused QKV into
    # the wq, wk, wv it saves, and fuse them back on load). OLMo-core saves the model's entries under
    # `model.`, beside the optimizer's; torchtitan at the top.
    weights = model.state_dict()
    state = {"model": weights} if checkpoint.format == OLMO_CORE else weights
    folder = checkpoint.path / OLMO_CORE_WEIGHTS if checkpoint.format == OLMO_CORE else checkpoint.path
    reader = ShardReader(folder)
    dcp.load(state, storage_reader=reader)
    model.load_state_dict(weights)
    model.eval()
    return LoadedModel(
        model=model, scored=scored, dp_group=dp_group, reads=reader.reads, whole=reader.whole_bytes()
    )


def sharded_model_spec(checkpoint: Checkpoint, model_builder: str | None) -> Any:
    """What the integration builds the model from in a layout: OLMo-core's `TransformerConfig` (the
    checkpoint's `config.json`, or `model_builder`'s), torchtitan's trainer config (`model_builder`'s)."""
    require_builder(checkpoint, model_builder)
    if checkpoint.format == OLMO_CORE and not model_builder:
        return olmo_core_model_config(checkpoint)
    spec = resolve_builder(str(model_builder))()
    expected = {OLMO_CORE: "build", TORCHTITAN: "model_spec"}[checkpoint.format]
    if isinstance(spec, nn.Module) or getattr(spec, expected, None) is None:
        wanted = {
            OLMO_CORE: "a TransformerConfig (or drop --model-builder: the checkpoint's config.json is used)",
            TORCHTITAN: "torchtitan's trainer config (a config_registry function)",
        }[checkpoint.format]
        raise ConfigError(
            f"watch: --tp/--fsdp build the {checkpoint.format} model in the layout from its config; "
            f"model_builder {model_builder!r} returned {type(spec).__name__}, expected {wanted}"
        )
    return spec


def load_hf(path: Path) -> nn.Module:
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise ConfigError(
            "watch: Hugging Face checkpoints need `transformers`: pip install 'inloop_eval[hf]'"
        ) from None
    model, info = AutoModelForCausalLM.from_pretrained(
        path, dtype="float32", disable_mmap=True, output_loading_info=True, ignore_mismatched_sizes=True
    )
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise CheckpointDamaged(
            f"watch: {path / (HF_INDEX if (path / HF_INDEX).is_file() else HF_SINGLE)} holds no tensor "
            f"{missing[0]!r} ({len(missing)} missing: {', '.join(missing[:5])}) that the model of its config.json "
            "holds; not scored with it initialised at random: save the checkpoint again"
        )
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda entry: entry[0])
    if mismatched:
        name, stored, expected = mismatched[0]
        raise CheckpointDamaged(
            f"watch: tensor {name!r} of {path / saved_files(path).get(name, HF_SINGLE)} has shape "
            f"{tuple(stored)}, the model of its config.json {tuple(expected)} ({len(mismatched)} tensors differ): "
            "save the checkpoint again with its config"
        )
    return model


def saved_files(path: Path) -> dict[str, str]:
    """Each saved tensor's safetensors file, by the index of a sharded Hugging Face checkpoint; empty for one
    saved in one file (`model.safetensors` holds them all)."""
    index = path / HF_INDEX
    return dict(json.loads(index.read_text()).get("weight_map", {})) if index.is_file() else {}


@dataclass(frozen=True)
class RecordedVocabulary:
    """The tokenizer a checkpoint says it was trained with: its size, its token -> id map when the
    checkpoint holds the tokenizer itself, and the file that says so."""

    size: int
    ids: dict[str, int] | None
    where: str


def recorded_vocabulary(checkpoint: Checkpoint) -> RecordedVocabulary | None:
    """What the checkpoint records of its tokenizer: a Hugging Face checkpoint's own `tokenizer.json`, an
    OLMo-core `config.json`'s tokenizer config (size only); None when it records none."""
    if checkpoint.format == HF and (checkpoint.path / "tokenizer.json").is_file():
        path = checkpoint.path / "tokenizer.json"
        ids = Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
        return RecordedVocabulary(size=len(ids), ids=ids, where=str(path))
    if checkpoint.format == OLMO_CORE and (checkpoint.path / CONFIG_FILE).is_file():
        try:
            data = json.loads((checkpoint.path / CONFIG_FILE).read_text())
        except (OSError, ValueError):
            return None
        found = find_tokenizer_config(data)
        if found is not None and isinstance(found.get("vocab_size"), int):
            where = f"{checkpoint.path / CONFIG_FILE} ({found.get('identifier')})"
            return RecordedVocabulary(size=int(found["vocab_size"]), ids=None, where=where)
    return None


def vocabulary_mismatch(tokenizer: Any, recorded: RecordedVocabulary) -> str | None:
    """How `tokenizer` differs from the one the checkpoint records; None when they agree."""
    backend = getattr(tokenizer, "backend", None)
    if recorded.ids is not None and backend is not None and hasattr(backend, "get_vocab"):
        ids = backend.get_vocab(with_added_tokens=True)
        moved = sorted(t for t in set(ids) | set(recorded.ids) if ids.get(t) != recorded.ids.get(t))
        if moved:
            token = moved[0]
            return (
                f"{len(moved)} tokens have other ids (e.g. {token!r}: {ids.get(token)} in the config's "
                f"tokenizer, {recorded.ids.get(token)} in {recorded.where})"
            )
        return None
    size = getattr(tokenizer, "vocab_size", None)
    if isinstance(size, int) and size != recorded.size:
        return f"it has {size} tokens, the checkpoint's ({recorded.where}) {recorded.size}"
    return None


def find_tokenizer_config(data: Any) -> dict[str, Any] | None:
    """The first OLMo-core `TokenizerConfig` entry anywhere in a saved config."""
    if isinstance(data, dict):
        if data.get("_CLASS_") == TOKENIZER_CONFIG_CLASS:
            return data
        children: Any = data.values()
    elif isinstance(data, list):
        children = data
    else:
        return None
    for child in children:
        found = find_tokenizer_config(child)
        if found is not None:
            return found
    return None


def evaluated_in_loop(checkpoint: Checkpoint) -> bool:
    """Whether the training loop evaluated this checkpoint's step before saving it: an OLMo-core checkpoint
    whose trainer state holds an evaluator callback's `last_evaluated_step` equal to its step (the in-loop
    callback of `inloop_eval.integrations.olmo_core.callback` evaluates before the checkpointer saves). False for the
    other formats, whose checkpoints do not say (their in-loop figures are found in `metrics.jsonl`)."""
    if checkpoint.format != OLMO_CORE:
        return False
    path = checkpoint.path / "train" / "rank0.pt"
    try:
        # The safe loader, allowed NumPy arrays (OLMo-core keeps NumPy's RNG state there), nothing else.
        with torch.serialization.safe_globals(NUMPY_GLOBALS):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # absent, or holding objects the safe loader refuses: the checkpoint does not say
        return False
    callbacks = state.get("callbacks") if isinstance(state, dict) else None
    if not isinstance(callbacks, dict):
        return False
    return any(
        isinstance(entry, dict) and entry.get("last_evaluated_step") == checkpoint.step
        for entry in callbacks.values()
    )
