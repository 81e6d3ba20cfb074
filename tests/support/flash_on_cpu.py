"""OLMo-core models built on flash-attention 2 on a CPU machine, as OLMo 3's configs build them on GPUs.

OLMo-core picks its torch backend instead where no GPU or flash-attn is found; `flash_build` shims both for the
build only, so the model's backends are `FlashAttention2Backend`s. Their kernel (`dispatch_flash_attn`) is
`stand_in_kernel` while `flash_kernel` is open: causal attention (within a sliding window where one is given)
computed by PyTorch SDPA for training forwards (gradient on), and an AssertionError for any forward without gradient, such as every forward of an
evaluation, which must route attention through the engine's own instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F


def stand_in_kernel(
    q, k, v, *, dropout_p=0.0, softmax_scale=None, causal=True, window_size=(-1, -1), **rest: Any
):
    """flash-attention's `flash_attn_func` for [B, T, H, D] tensors in training: causal SDPA (GQA by repeated
    heads) within `window_size` (keys at most `window_size[0]` back; -1: no window); raises when called without
    gradient (an evaluation's forward)."""
    if not torch.is_grad_enabled():
        raise AssertionError("flash-attention's kernel was called during an evaluation")
    if any(value is not None for value in rest.values()) or window_size[1] not in (-1, 0) or not causal:
        raise AssertionError(f"the stand-in kernel covers plain causal rows only, not {rest} {window_size}")
    n_rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(n_rep, dim=2), v.repeat_interleave(n_rep, dim=2)
    back_TT = torch.arange(q.shape[1])[:, None] - torch.arange(q.shape[1])[None, :]
    mask_TT = (back_TT >= 0) & ((back_TT <= window_size[0]) | (window_size[0] < 0))
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask_TT.to(q.device),
        dropout_p=dropout_p, scale=softmax_scale,
    )  # fmt: skip
    return out.transpose(1, 2)


@contextmanager
def flash_build() -> Iterator[None]:
    """While open, OLMo-core finds a GPU and flash-attn: models built take the backend their config names."""
    import olmo_core.nn.attention.backend as backends
    import olmo_core.nn.attention.flash_attn_api as flash_api

    with (
        mock.patch.object(torch.cuda, "is_available", lambda: True),
        mock.patch.object(backends, "has_flash_attn_2", lambda: True),
        mock.patch.object(flash_api, "has_flash_attn_2", lambda: True),
    ):
        yield


@contextmanager
def flash_kernel() -> Iterator[None]:
    """While open, flash-attention's kernel is `stand_in_kernel`."""
    import olmo_core.nn.attention.backend as backends

    with mock.patch.object(backends, "dispatch_flash_attn", stand_in_kernel):
        yield
