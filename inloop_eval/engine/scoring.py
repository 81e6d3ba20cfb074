"""From planned batches to per-pair loglikelihoods: every batch forwarded through the model's adapter, its
targets scored by the outputs it returns (`adapter.ModelOutputs`, one implementation per output form in
`engine/outputs/`), in float32, summed per pair in float64. One path for every model.
Legend: N continuation tokens in a batch, U distinct positions predicting them, P pairs scored, B rows,
T time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from inloop_eval.engine.adapter import ForwardInputs, HeadWorkspace, ModelAdapter, SharedPrefix, TokenCount
from inloop_eval.engine.batching import Batch
from inloop_eval.engine.flex_kernel import FlexKernel
from inloop_eval.engine.logprobs import HostTargets
from inloop_eval.engine.tree_attention import TreeMask
from inloop_eval.errors import ModelOutputError


@dataclass
class PairScores:
    """ll: sum of continuation log-probs [P] (float32 log-probs summed in float64); greedy: every continuation
    token is the model's argmax [P]; tokens_forwarded: padded tokens these batches sent through the model."""

    ll: np.ndarray
    greedy: np.ndarray
    tokens_forwarded: int


def forward_inputs(
    adapter: ModelAdapter,
    batch: Batch,
    min_vocab: int,
    prefix: SharedPrefix | None = None,
    mask_rendering: str = "dense",
    kernel: FlexKernel | None = None,
) -> ForwardInputs:
    """The batch's tensors on the model's device: the distinct positions read, the position of each target,
    for a packed batch its mask (`TreeMask`, rendered as `mask_rendering` says) and position ids, and the
    kept prefix its rows begin with (or that it forwards); `kernel` runs a block rendering."""
    device = adapter.device
    width = batch.input_ids_BT.shape[1]
    flat_U, position_N = np.unique(batch.rows_N * width + batch.cols_N, return_inverse=True)
    rows_U, cols_U = np.divmod(flat_U, width)
    position_N = position_N.reshape(-1)
    inputs = ForwardInputs(
        to_device(batch.input_ids_BT, device),
        to_device(rows_U, device),
        to_device(cols_U, device),
        to_device(position_N, device),
        to_device(batch.target_N, device),
        min_vocab=min_vocab,
        prefix=prefix,
        keeps_prefix=batch.keeps_prefix,
        mask_rendering=mask_rendering,
        kernel=kernel,
        host_targets=HostTargets(position_N, batch.target_N),
    )
    if (batch.span_end_BT is not None or batch.prefix_length) and not adapter.needs.packing:
        raise ValueError(
            f"run_batches: a packed batch was planned for {type(adapter).__name__}, which does not take an "
            "attention mask and position ids; plan with the adapter's needs.packing"
        )
    if batch.prefix_length and not adapter.needs.prefix_reuse:
        raise ValueError(
            f"run_batches: a batch after a kept prefix was planned for {type(adapter).__name__}, which keeps "
            "no prefix; plan with the adapter's needs.prefix_reuse"
        )
    if batch.span_end_BT is not None and batch.position_ids_BT is not None:
        after = 0 if batch.keeps_prefix else batch.prefix_length
        inputs.position_ids_BT = to_device(batch.position_ids_BT, device)
        span_end_BT = to_device(batch.span_end_BT, device)
        inputs.tree = TreeMask(span_end_BT, inputs.position_ids_BT, after, mask_rendering, kernel)
    return inputs


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """`array` as a tensor on `device`; to a CUDA device copied from pinned memory without waiting, so that
    the host goes on to the next batch while the device is busy (pinning is for CUDA only)."""
    tensor = torch.from_numpy(array)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def pair_sums(
    owners: list[np.ndarray], logps: list[torch.Tensor], greedies: list[torch.Tensor], n_pairs: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per pair, the sum of its targets' float32 log-probs in float64 [P] and whether every one is greedy
    [P], from each batch's pairs, log-probs and greedy flags (lists over the batches, in order, of [N]): the
    scores come to the host in one copy, and are added in batch order, as batch by batch they would be."""
    ll_P = torch.zeros(n_pairs, dtype=torch.float64)
    n_bad_P = torch.zeros(n_pairs, dtype=torch.int64)
    if owners:
        scores_2N = torch.stack([torch.cat(logps), torch.cat(greedies).float()]).cpu()
        owner_N = torch.from_numpy(np.concatenate(owners))
        ll_P.index_add_(0, owner_N, scores_2N[0].double())
        n_bad_P.index_add_(0, owner_N, (scores_2N[1] == 0).long())
    return ll_P.numpy(), (n_bad_P == 0).numpy()


def _prefix_for(batch: Batch, kept: SharedPrefix | None) -> SharedPrefix | None:
    """The kept prefix `batch` forwards (a new one) or begins its rows with (`kept`), or None."""
    if batch.keeps_prefix:
        return SharedPrefix(batch.prefix_length)
    if not batch.prefix_length:
        return None
    if kept is None or kept.length != batch.prefix_length or kept.states is None:
        raise ValueError(
            f"run_batches: a batch planned after a kept prefix of {batch.prefix_length} tokens follows "
            f"{'none' if kept is None else f'one of {kept.length}'}; the planner puts each prefix before its batches"
        )
    return kept


@contextmanager
def _naming_batch(describe: Callable[[int], str], batch: Batch) -> Iterator[None]:
    """A ModelOutputError raised in the block names the batch's first pair (or says it is padding)."""
    try:
        yield
    except ModelOutputError as exc:
        where = describe(int(batch.pair_N[0])) if batch.pair_N.size else "a padding batch"
        raise ModelOutputError(f"{where}: {exc}") from None


def run_batches(
    adapter: ModelAdapter,
    batches: Iterable[Batch],
    n_pairs: int,
    tokens: TokenCount,
    describe: Callable[[int], str] = lambda p: f"pair {p}",
    progress: Callable[[int], None] | None = None,
    min_vocab: int = 0,
    mask_rendering: str = "dense",
    kernel: FlexKernel | None = None,
) -> PairScores:
    """Forward every batch and sum log-probs per pair; each forward's tokens are added to `tokens` as it is
    made. Batches with no targets (dummies, kept prefixes) are forwarded and their outputs discarded; a kept
    prefix lives until a batch that does not begin with it. Packed batches' masks are rendered as
    `mask_rendering` says (`tree_attention.mask_rendering`), a block rendering run by `kernel`."""
    # Each batch's scores stay where they were computed until every batch is queued: the host never waits
    # for the device between batches, and copies the scores once, at the end (`pair_sums`).
    owners: list[np.ndarray] = []
    logps: list[torch.Tensor] = []
    greedies: list[torch.Tensor] = []
    start = tokens.total
    workspace = HeadWorkspace()
    kept: SharedPrefix | None = None
    for batch in batches:
        kept = _prefix_for(batch, kept)
        inputs = forward_inputs(adapter, batch, min_vocab, kept, mask_rendering, kernel)
        with _naming_batch(describe, batch):
            outputs = adapter.forward(inputs)
            tokens.add(adapter.tokens_fed(inputs))
            if batch.pair_N.size == 0:
                continue
            logp_N, greedy_N = outputs.target_logprobs(inputs, workspace)
        owners.append(batch.pair_N)
        logps.append(logp_N)
        greedies.append(greedy_N)
        if progress is not None:
            progress(len(np.unique(batch.pair_N)))
    return PairScores(*pair_sums(owners, logps, greedies, n_pairs), tokens.total - start)
