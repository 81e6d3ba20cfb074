"""A Hugging Face causal LM loaded FSDP2-sharded from its safetensors (the watcher's `--fsdp`): built from its
`config.json` on the meta device, each decoder layer (the model's `_no_split_modules`) and the root sharded
by `fully_shard` over the layout mesh's `dp` ranks, its local shards allocated empty on the device (no
random init of whole tensors), then each parameter's local shard (FSDP2's `Shard(0)`: torch.chunk-style
rows, the last ranks holding fewer or none) read from its safetensors file with `safe_open(...).get_slice`,
only the rows this rank holds, by `pread` (a mapped file rewritten in place would kill the rank with
SIGBUS). A tensor the files lack, or of another shape than the config's model's, is `CheckpointDamaged`
naming it and its file: tried again when the files change. Buffers are replicated: a saved one is read whole
by every rank; one no file holds (rotary `inv_freq`) is computed again by building its parameter-free module
from the config, as transformers does. Tensor parallelism (`--tp`) is refused with the remedy: it is not built for Hugging Face models here."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from inloop_eval.checkpoints.formats import CheckpointDamaged
from inloop_eval.checkpoints.layout import ParallelLayout
from inloop_eval.checkpoints.shard_reads import ShardRead
from inloop_eval.errors import ConfigError
from inloop_eval.integrations.hf.checkpoint import INDEX_FILE, SINGLE_FILE


def load_in_layout(
    path: Path, layout: ParallelLayout, device: torch.device
) -> tuple[nn.Module, ProcessGroup | None, list[ShardRead], int]:
    """The causal LM saved at `path`, FSDP2 over the layout's `dp` ranks, its weights read shard by shard:
    (the model in eval mode, the data-parallel group, what this rank read, those tensors' bytes whole)."""
    if layout.tp > 1:
        raise ConfigError(
            f"watch: {path} is a Hugging Face checkpoint, which --tp does not load sharded (only --fsdp "
            "does); run the watcher with --fsdp or without a layout"
        )
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)
    rename = model_names(model)  # before sharding: FSDP2 swaps the model's class for a subclass of it
    mesh = layout.mesh()["dp"]
    layers = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in layers:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device=device)
    reads, whole = read_weights(model, path, rename)
    restore_computed_buffers(model)
    return model.eval(), layout.dp_group(), reads, whole


def weight_files(path: Path, rename: Callable[[str], str]) -> dict[str, tuple[Path, str]]:
    """Each of the model's tensors the checkpoint saves: (its safetensors file, its name there), through the
    index of a sharded checkpoint, else the one file; the saved names renamed as transformers renames them
    on load (e.g. GPT-NeoX's `embed_out` is the model's `lm_head`)."""

    if (path / INDEX_FILE).is_file():
        weight_map = json.loads((path / INDEX_FILE).read_text())["weight_map"]
        stored = {name: path / file for name, file in weight_map.items()}
    elif (path / SINGLE_FILE).is_file():
        with safe_open(str(path / SINGLE_FILE), framework="pt", backend="pread") as handle:
            stored = dict.fromkeys(handle.keys(), path / SINGLE_FILE)
    else:
        raise ConfigError(
            f"watch: {path} holds neither {INDEX_FILE} nor {SINGLE_FILE}; --fsdp reads Hugging Face "
            "safetensors only (save with save_pretrained(safe_serialization=True))"
        )
    return {rename(name): (file, name) for name, file in stored.items()}


def model_names(model: nn.Module) -> Callable[[str], str]:
    """A saved tensor's name -> the model's, by transformers' own renamings of the model's type (none in a
    transformers without them); ConfigError for a tensor transformers converts (fuses or splits) on load,
    which cannot be read row by row."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    except ImportError:
        return lambda name: name
    mapping = get_model_conversion_mapping(model)
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    names = dict.fromkeys(model.state_dict(keep_vars=True))
    prefix = getattr(model, "base_model_prefix", None)

    def rename(name: str) -> str:
        renamed, converted = rename_source_key(name, renamings, converters, prefix, names)
        if converted is not None:
            raise ConfigError(
                f"watch: the Hugging Face checkpoint's tensor {name!r} is converted on load ({converted}), "
                "which --fsdp cannot read row by row; run the watcher without --fsdp"
            )
        return renamed if renamed in names or name not in names else name

    return rename


def read_weights(model: nn.Module, path: Path, rename: Callable[[str], str]) -> tuple[list[ShardRead], int]:
    """Fill every tensor of `model`'s state dict from the files: a sharded one its local rows only, a
    replicated one whole; a tied tensor once. (what was read, those tensors' bytes whole)."""

    files = weight_files(path, rename)
    reads: list[ShardRead] = []
    whole = 0
    filled: set[int] = set()
    handles: dict[Path, Any] = {}
    unsaved: dict[str, torch.Tensor] = {}
    try:
        for name, tensor in model.state_dict(keep_vars=True).items():
            if id(tensor) in filled:
                continue  # tied to a tensor already read (e.g. lm_head and the embedding)
            if name not in files:
                unsaved[name] = tensor  # tied to one read later, a buffer computed again, or missing
                continue
            file, saved_name = files[name]
            if file not in handles:
                handles[file] = safe_open(str(file), framework="pt", device="cpu", backend="pread")
            stored = handles[file].get_slice(saved_name)
            shape = tuple(stored.get_shape())
            if tuple(tensor.shape) != shape:
                raise CheckpointDamaged(
                    f"watch: tensor {saved_name!r} of {file} has shape {shape}, the model of its config.json "
                    f"{tuple(tensor.shape)}: save the checkpoint again with its config"
                )
            offsets, local = local_box(tensor)
            with torch.no_grad():
                if local.numel():
                    part = stored[offsets[0] : offsets[0] + local.shape[0]] if shape else stored[:]
                    local.copy_(part.reshape(local.shape))
                    nbytes = part.numel() * part.element_size()
                else:
                    nbytes = 0
            itemsize = dtype_size(stored.get_dtype())
            whole += int(torch.Size(shape).numel()) * itemsize
            reads.append(
                ShardRead(
                    fqn=saved_name,
                    chunk=(),
                    offsets=offsets,
                    lengths=tuple(local.shape),
                    nbytes=nbytes,
                    in_place=isinstance(tensor, DTensor),
                )
            )
            filled.add(id(tensor))
    finally:
        handles.clear()
    missing = [n for n, t in unsaved.items() if id(t) not in filled and n in persistent_names(model)]
    if missing:
        listing = INDEX_FILE if (path / INDEX_FILE).is_file() else SINGLE_FILE
        raise CheckpointDamaged(
            f"watch: {path / listing} holds no tensor {missing[0]!r} ({len(missing)} missing) that the model of "
            "its config.json holds; is the checkpoint complete and saved by save_pretrained?"
        )
    return reads, whole


def local_box(tensor: torch.Tensor) -> tuple[tuple[int, ...], torch.Tensor]:
    """Where this rank's part of the saved tensor (of `tensor`'s shape) starts, and the local tensor to fill:
    an FSDP2 parameter's unpadded local shard (its rows of `Shard(0)`), a replicated tensor whole."""
    if not isinstance(tensor, DTensor):
        return (0,) * tensor.dim(), tensor.detach()

    local_shape, offsets = compute_local_shape_and_global_offset(
        tensor.shape, tensor.device_mesh, tensor.placements
    )
    local = tensor.to_local().detach()
    if tuple(local.shape) != tuple(local_shape):
        raise AssertionError(f"local shard {tuple(local.shape)} != {tuple(local_shape)}")
    return tuple(int(o) for o in offsets), local


def dtype_size(name: str) -> int:
    """Bytes per element of a safetensors dtype name (F32, BF16, I64...)."""
    digits = "".join(c for c in name if c.isdigit())
    return max(1, int(digits) // 8) if digits else 1


def persistent_names(model: nn.Module) -> set[str]:
    names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    for prefix, module in model.named_modules():
        for name in module._buffers:
            if name not in module._non_persistent_buffers_set:
                names.add(f"{prefix}.{name}" if prefix else name)
    return names


def restore_computed_buffers(model: nn.Module) -> None:
    """The non-persistent buffers, which no file holds (rotary `inv_freq`, computed at construction): each owning module built
    again from its config on the CPU, its buffers copied; ConfigError for one that cannot be."""
    for prefix, module in model.named_modules():
        missing = [n for n in module._buffers if n in module._non_persistent_buffers_set]
        if not missing:
            continue
        config = getattr(module, "config", None)
        if config is None or any(True for _ in module.parameters(recurse=False)):
            raise ConfigError(
                f"watch: --fsdp cannot compute buffer {prefix}.{missing[0]} of the Hugging Face model "
                "(no file holds it); run the watcher without --fsdp"
            )
        with torch.device("cpu"):
            fresh = type(module)(config)
        for name in missing:
            module._buffers[name] = fresh._buffers[name].to(module._buffers[name].device)
