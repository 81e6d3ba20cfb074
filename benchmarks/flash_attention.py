"""OLMo-core models on flash-attention 2 wherever the benchmarks run, as OLMo 3's configs build them on GPUs.

Where a GPU and flash-attn are at hand, nothing here changes anything. Elsewhere OLMo-core would quietly build
its torch backend instead; `flash_model_build` shims a GPU and flash-attn for the build only, so the model's
backends are `FlashAttention2Backend`s, and `flash_kernel_stand_in` makes its kernel (`dispatch_flash_attn`)
the causal attention flash-attention computes, by PyTorch SDPA, so that OLMo-core's own evaluator (which
calls the kernel) runs on the CPU. Ours never calls it: during an evaluation every OLMo-core backend is
routed through the engine's attention (`inloop_eval/integrations/olmo_core/attention.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F
from torch import Tensor


def flash_attn_installed() -> bool:
    from olmo_core.nn.attention.flash_attn_api import has_flash_attn_2

    return torch.cuda.is_available() and has_flash_attn_2()


def causal_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = True,
    window_size: tuple[int, int] = (-1, -1),
    **rest: Any,
) -> Tensor:
    """What flash-attention's `flash_attn_func` computes for [B, T, H, D] plain causal rows, by SDPA."""
    if any(value is not None for value in rest.values()) or not causal:
        raise NotImplementedError(f"the stand-in covers plain causal rows only, not {sorted(rest)}")
    n_rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(n_rep, dim=2), v.repeat_interleave(n_rep, dim=2)
    T = q.shape[1]
    mask = None
    if tuple(window_size) != (-1, -1):
        back = torch.arange(T, device=q.device)[:, None] - torch.arange(T, device=q.device)[None, :]
        mask = (back >= 0) & (back <= window_size[0])
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, dropout_p=dropout_p,
        is_causal=mask is None, scale=softmax_scale,
    )  # fmt: skip
    return out.transpose(1, 2)


@contextmanager
def flash_model_build() -> Iterator[None]:
    """While open, OLMo-core finds a GPU and flash-attn (where they are missing): models built take the
    backend their config names."""
    if flash_attn_installed():
        yield
        return
    import olmo_core.nn.attention.backend as backends
    import olmo_core.nn.attention.flash_attn_api as flash_api

    with (
        mock.patch.object(torch.cuda, "is_available", lambda: True),
        mock.patch.object(backends, "has_flash_attn_2", lambda: True),
        mock.patch.object(flash_api, "has_flash_attn_2", lambda: True),
    ):
        yield


def flash_kernel_stand_in() -> Any:
    """A context in which flash-attention's kernel is `causal_attention` (where flash-attn is missing)."""
    if flash_attn_installed():
        return nullcontext()
    import olmo_core.nn.attention.backend as backends

    return mock.patch.object(backends, "dispatch_flash_attn", causal_attention)
