"""Running torchtitan 0.3.0's real `Trainer` on CPU (gloo) with torch 2.13.0, for the tests of
inloop_eval.integrations.torchtitan. torchtitan targets CUDA and a torch nightly; on this pair it stops at:

1. torchtitan/tools/utils.py:54 takes the device type "cuda" when no accelerator is found, so
   trainer.py:301 `torch.cuda.set_device` fails (`torch._C` has no `_cuda_setDevice` on a CPU build). The
   device type and module are set to CPU before the rest of torchtitan imports them (`use_cpu`).
2. components/metrics.py:42 `DeviceMemoryMonitor` asks the device module for its name, properties and memory
   statistics, which `torch.cpu` does not have: the CPU module here answers with zeros.
3. distributed/utils.py:586 `barrier(device_ids=[device_module.current_device()])` needs an integer index
   (`torch.cpu.current_device()` returns "cpu"): 0 here.
4. distributed/utils.py:595 calls `torch.distributed.set_timeout`, which torch 2.13.0 does not have (the
   private `distributed_c10d._set_pg_timeout` does the same): aliased.
5. Attention (a config change, no patch): llama3's default FlexAttention has no backward on CPU
   (torch/nn/attention/flex_attention.py:2082) and varlen calls `aten::_flash_attention_forward` (CUDA
   only); `get_attention_config` refuses "sdpa" for language models, so `cpu_model_config` puts
   `ScaledDotProductAttention` (causal) into the built config.
6. The default `spmd_backend="spmd_types"` fails in `fully_shard` on more than one rank ("all parameters must
   be DTensors on the full SPMD mesh", torch/distributed/fsdp/_fully_shard/_fsdp_param.py:346):
   `partial_dtensor`, torchtitan's DTensor tensor parallelism, is used.
7. FSDP over gloo: torchtitan sets gradient_divide_factor 1.0, which makes FSDP reduce with PREMUL_SUM, which
   gloo lacks: `sum_reductions` switches to a plain sum (the same numbers at factor 1).

Only this file patches torchtitan or torch; inloop_eval.integrations.torchtitan patches nothing.
`tiny_decoder` builds small seeded llama3 and qwen3 decoders with the attention torchtitan's configs give
them (FlexAttention) or causal SDPA (5 above), for the packing tests.
"""

from __future__ import annotations

import types

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule


def _cpu_device_module() -> types.SimpleNamespace:
    """`torch.cpu` with what torchtitan asks a device module for (2, 3 above)."""
    module = types.SimpleNamespace(
        **{k: getattr(torch.cpu, k) for k in dir(torch.cpu) if not k.startswith("__")}
    )
    module.get_device_name = lambda device=None: "cpu"
    module.get_device_properties = lambda device=None: types.SimpleNamespace(total_memory=1 << 30)
    module.reset_peak_memory_stats = lambda device=None: None
    module.empty_cache = lambda: None
    module.memory_stats = lambda device=None: {}
    module.current_device = lambda: 0
    return module


def use_cpu() -> None:
    """Points torchtitan at the CPU (1-4 above). Call before importing anything else from torchtitan."""
    import torchtitan.tools.utils as tt_utils

    tt_utils.device_type, tt_utils.device_module = "cpu", _cpu_device_module()
    if not hasattr(dist, "set_timeout"):
        dist.set_timeout = dist.distributed_c10d._set_pg_timeout


def cpu_model_config(config: object) -> None:
    """Causal SDPA attention in place of every FlexAttention config of a torchtitan model config (5 above)."""
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention

    for _, _, parent, attr in list(config.traverse(FlexAttention.Config)):  # type: ignore[attr-defined]
        if isinstance(parent, list):
            parent[attr] = ScaledDotProductAttention.Config()
        else:
            setattr(parent, attr, ScaledDotProductAttention.Config())


def sum_reductions(model: torch.nn.Module) -> None:
    """FSDP's gradient reductions as plain sums, which gloo supports (7 above)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)


VOCAB = 50304  # the GPT-NeoX tokenizer's 50277 ids, rounded up to a multiple of 64


def tiny_decoder(
    family: str, core: str = "sdpa", max_seq_len: int = 512, seed: int = 0, moe: bool = False
) -> torch.nn.Module:
    """A seeded torchtitan decoder of the GPT-NeoX vocabulary, d_model 32, two layers, 4 query heads on 2
    key/value heads, in eval mode: `family` "llama3" (fused QKV, complex RoPE with llama scaling) or "qwen3"
    (QK norms, head width 16 beside d_model 32, cos/sin RoPE, tied embeddings; with `moe`, two experts in
    place of the feed-forward); `core` its core attention: "sdpa" (causal `ScaledDotProductAttention`),
    "flex" (torchtitan's default, `FlexAttention`) or "varlen"."""
    from torchtitan.models.common import ComplexRoPE, CosSinRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers
    from torchtitan.models.qwen3 import Qwen3Model, _build_qwen3_layers, _build_qwen3_moe_layers, _qwen3_norm

    dim, n_heads, n_kv_heads = 32, 4, 2
    backend = "flex" if core == "sdpa" else core
    parts = dict(
        dim=dim,
        vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=dim),
        lm_head=Linear.Config(in_features=dim, out_features=VOCAB),
    )
    if family == "llama3":
        rope = ComplexRoPE.Config(dim=dim // n_heads, max_seq_len=max_seq_len, theta=500000, scaling="llama")
        layers = _build_llama3_layers(
            n_layers=2, dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads, hidden_dim=64, rope=rope,
            attn_backend=backend,
        )  # fmt: skip
        config = Llama3Model.Config(**parts, norm=RMSNorm.Config(normalized_shape=dim), layers=layers)
    elif family == "qwen3":
        head_dim = 16
        rope = CosSinRoPE.Config(dim=head_dim, max_seq_len=max_seq_len, theta=1000000.0)
        heads = dict(n_layers=2, dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim)
        if moe:
            layers = _build_qwen3_moe_layers(
                **heads, moe_hidden_dim=32, num_experts=2, top_k=1, attn_backend=backend,
                moe_comm_backend="standard", rope=rope,
            )  # fmt: skip
        else:
            layers = _build_qwen3_layers(**heads, hidden_dim=64, attn_backend=backend, rope=rope)
        config = Qwen3Model.Config(**parts, norm=_qwen3_norm(dim), layers=layers, enable_weight_tying=True)
    else:
        raise ValueError(family)
    if core == "sdpa":
        cpu_model_config(config)
    torch.manual_seed(seed)
    model = config.build()
    model.init_weights(buffer_device=None)
    return model.eval()
