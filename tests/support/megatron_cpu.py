"""Running megatron-core 0.16.1 on CPU (gloo) with torch 2.13.0, for the tests of inloop_eval.integrations.megatron.
Megatron targets CUDA; without Transformer Engine or apex it falls back to plain torch layers, and stops at:

1. core/utils.py `GlobalMemoryBuffer.get_tensor` (the sequence-parallel all-gather buffer) allocates on
   `torch.cuda.current_device()`;
2. tensor_parallel/random.py: the RNG tracker's `add` and `fork` read and set CUDA RNG states
   (`torch.cuda.get_rng_state`, `_get_cuda_rng_state`, `_set_cuda_rng_state`); here each tracked state is a
   CPU `torch.Generator` state, forked the same way;
3. pipeline_parallel/schedules.py creates its token counter with `torch.zeros(..., device="cuda")`;
4. tensor_parallel/mappings.py (the sequence-parallel reduce-scatter) and tensor_parallel/layers.py (the
   sequence-parallel all-gather of a linear layer's backward) allocate on `torch.cuda.current_device()`;
5. pipeline_parallel/p2p_communication.py allocates the received activations on `torch.cuda.current_device()`
   and calls `torch.cuda.synchronize()` after batched p2p (the models here set `batch_p2p_comm=False`);
6. without apex or Transformer Engine the layer norm is torch's (`WrappedTorchNorm`), which refuses sequence
   parallelism (transformer/torch_norm.py: "sequence parallel not supported by torch LayerNorm") though the
   arithmetic is the same: `local_spec` and the block's final norm use `SequenceParallelLayerNorm`, a torch
   LayerNorm whose parameters carry Megatron's `sequence_parallel` mark (their gradients are summed over TP,
   as apex's and Transformer Engine's norms are);
7. models/common/embeddings/rotary_pos_embedding.py moves RoPE's inverse frequencies to
   `torch.cuda.current_device()` before its first table (`RotaryEmbedding.get_emb`);
8. models/common/language_module/language_module.py, for output weights tied to the embedding under pipeline
   parallelism, moves the last stage's copy to CUDA (`weight.data.cuda()`) before the all-reduce that makes it
   the first stage's (`setup_embeddings_and_output_layer`); here `Tensor.cuda` returns the tensor during that
   method only.

Each module named above sees a `torch` whose CUDA calls answer for the CPU; torch itself is patched only
during the method of 8. Only this file patches Megatron; inloop_eval.integrations.megatron patches nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Iterator
from typing import Any

import torch


class _CPUCuda(types.SimpleNamespace):
    """`torch.cuda` for the CPU: the current device is the CPU, and synchronizing is a no-op."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None


def _on_cpu(device: Any) -> Any:
    return "cpu" if device is not None and torch.device(device).type == "cuda" else device


class _CPUTorch(types.ModuleType):
    """`torch` with CUDA devices read as the CPU (for the few Megatron modules that name them)."""

    cuda = _CPUCuda()

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def zeros(*size: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(*size, device=_on_cpu(device), **kwargs)

    @staticmethod
    def empty(*size: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return torch.empty(*size, device=_on_cpu(device), **kwargs)

    @staticmethod
    def ones(*size: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return torch.ones(*size, device=_on_cpu(device), **kwargs)


class SequenceParallelLayerNorm(torch.nn.LayerNorm):
    """torch's LayerNorm built as Megatron builds a norm, accepting sequence parallelism (6 above)."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__(hidden_size, eps=eps)
        for param in self.parameters():
            param.sequence_parallel = config.sequence_parallel


def local_spec() -> Any:
    """Megatron's local (no Transformer Engine) GPT layer spec with `SequenceParallelLayerNorm` norms."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec()
    norms = {"input_layernorm": SequenceParallelLayerNorm, "pre_mlp_layernorm": SequenceParallelLayerNorm}
    return dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules, **norms))


# The generator whose state the RNG tracker forks on CPU (CUDA's default generator on a GPU).
TRACKED = torch.Generator()


def _tracked_states() -> None:
    """The RNG tracker on CPU generators (2 above)."""
    from megatron.core.tensor_parallel import random as mrandom

    generator = TRACKED

    def get_state(*args: Any, **kwargs: Any) -> torch.Tensor:
        return generator.get_state()

    def set_state(state: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        generator.set_state(state)

    def add(self: Any, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        self.seeds_.add(seed)
        if name in self.states_:
            raise Exception(f"cuda rng state {name} already exists")
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    mrandom._get_cuda_rng_state = get_state
    mrandom._set_cuda_rng_state = set_state
    mrandom.CudaRNGStatesTracker.add = add


def _tied_output_on_cpu() -> None:
    """`LanguageModule.setup_embeddings_and_output_layer` with `Tensor.cuda` returning the tensor (8 above)."""
    from megatron.core.models.common.language_module.language_module import LanguageModule

    setup = LanguageModule.setup_embeddings_and_output_layer
    if getattr(setup, "on_cpu", False):
        return

    def setup_on_cpu(self: Any) -> None:
        cuda = torch.Tensor.cuda
        torch.Tensor.cuda = lambda tensor, *args, **kwargs: tensor  # type: ignore[method-assign]
        try:
            setup(self)
        finally:
            torch.Tensor.cuda = cuda  # type: ignore[method-assign]

    setup_on_cpu.on_cpu = True  # type: ignore[attr-defined]
    LanguageModule.setup_embeddings_and_output_layer = setup_on_cpu  # type: ignore[method-assign]


def use_cpu() -> None:
    """Points megatron-core at the CPU (1-8 above). Call before building a model; idempotent."""
    import megatron.core.models.common.embeddings.rotary_pos_embedding as rotary
    import megatron.core.pipeline_parallel.p2p_communication as p2p
    import megatron.core.pipeline_parallel.schedules as schedules
    import megatron.core.tensor_parallel.layers as layers
    import megatron.core.tensor_parallel.mappings as mappings
    import megatron.core.transformer.transformer_block as transformer_block
    import megatron.core.utils as mutils

    cpu_torch = _CPUTorch()
    for module in (mutils, schedules, p2p, mappings, layers, rotary):
        module.torch = cpu_torch
    _tracked_states()
    _tied_output_on_cpu()
    transformer_block.LayerNormImpl = SequenceParallelLayerNorm


@contextlib.contextmanager
def model_parallel(**sizes: int) -> Iterator[None]:
    """`parallel_state.initialize_model_parallel(**sizes)` for the body, destroyed after (so that one launch
    runs several layouts), with the RNG tracker seeded as Megatron's `model_parallel_cuda_manual_seed` does."""
    from megatron.core import parallel_state, tensor_parallel

    parallel_state.initialize_model_parallel(**sizes, distributed_timeout_minutes=2)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        tensor_parallel.get_cuda_rng_tracker().reset()
