"""What one evaluation hands every evaluator (`EvalContext`), and the one scoring call every evaluator makes
(`score_share`): equalize forward calls across ranks, run the model over the batches an evaluator planned for
this rank, and agree that every rank got through. An evaluator is then only what it scores and how it plans
it (its `Share`) and how it reduces the scores (its metric).

What `score_share` promises, on every rank of the data-parallel group alike: it makes the
same number of forward calls (dummies where a rank has fewer batches, `batching.equalize_forward_calls`),
and joins the task's agreement points at the same places (planning, between forwards, after the last one),
so that a rank that fails anywhere stops every rank before the metric sync (`inloop_eval.distributed`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from torch.distributed import ProcessGroup

from inloop_eval.distributed import TaskAgreement, data_parallel_in
from inloop_eval.engine.adapter import ModelAdapter, TokenCount
from inloop_eval.engine.batching import Batch, BatchShape, equalize_forward_calls
from inloop_eval.engine.flex_kernel import FlexKernel, sequence_length
from inloop_eval.engine.scoring import PairScores, run_batches


@dataclass(frozen=True)
class EvalContext:
    """What one evaluation hands every evaluator (made by the orchestrator for each run).

    adapter: the model.
    max_length: the longest input: the config's `max_length`, else the model's own (None: unknown).
    dp_group: the data-parallel group documents are sharded and metrics reduced over; None: the world.
    shape: what every planned batch must be (packing, width multiple), from the adapter's needs and the config.
    tokens: the tokens forwarded in this run, added to at each forward.
    strict: raise a failure rather than reporting `failed = 1`.
    progress: called with the number of requests (or sequences) of each batch scored.
    mask_rendering: how packed batches' masks are rendered (`tree_attention.mask_rendering`).
    kernel: what runs a block rendering (`flex_kernel.FlexKernel`; None for dense).
    """

    adapter: ModelAdapter
    max_length: int | None
    dp_group: ProcessGroup | None
    shape: BatchShape
    tokens: TokenCount
    strict: bool = False
    progress: Callable[[int], None] | None = None
    mask_rendering: str = "dense"
    kernel: FlexKernel | None = None

    @property
    def data_parallel(self) -> tuple[int, int]:
        """(size, rank) of this rank in the data-parallel group."""
        return data_parallel_in(self.dp_group)

    def logits_width(self) -> int:
        """The model's vocabulary bound: its input embedding's rows where known, else its logits' width from
        a one-row probe (every rank makes it alike, as wide as the batch shape needs)."""
        adapter = self.adapter
        if adapter.vocab_size is not None:
            return adapter.vocab_size
        width = min(self.shape.width_multiple, self.max_length or self.shape.width_multiple)
        return adapter.logits_width(width, self.tokens)


@dataclass(frozen=True)
class Share:
    """What one rank scores of an evaluator's work (requests or sequences), planned.

    batches: this rank's batches, planned in the context's batch shape; their `pair_N` index the items,
        0..n_items-1.
    n_items: how many items are scored.
    describe: an item as an error names it (e.g. `task 'piqa' doc 17 choice 2`).
    min_vocab: the tokenizer's vocabulary, which the model's logits must cover (0: unchecked).
    """

    batches: list[Batch]
    n_items: int
    describe: Callable[[int], str]
    min_vocab: int = 0


def score_share(context: EvalContext, agreement: TaskAgreement, title: str, share: Share) -> PairScores:
    """This rank's `share` of an evaluator's work, scored: forwarded with every rank making as many calls,
    and agreed after the last forward. Returns the loglikelihood sums and greedy flags per item.

    title: the evaluator as a progress display names it (e.g. `task 'piqa'`).
    """
    start_progress(context.progress, title, share.n_items)
    scores = run_batches(
        context.adapter,
        equalize_forward_calls(share.batches, agreement, context.shape.width_multiple),
        share.n_items,
        context.tokens,
        describe=share.describe,
        progress=context.progress,
        min_vocab=share.min_vocab,
        mask_rendering=context.mask_rendering,
        kernel=context.kernel,
    )
    agreement.agree()  # a rank that failed after its last forward stops every rank before the sync
    return scores


def start_progress(progress: Callable[[int], None] | None, title: str, total: int) -> None:
    """Tell a progress display that shows totals (one with a `start(title, total)` method, e.g. the CLI's)
    that `title` is about to score `total` requests (or sequences) on this rank."""
    start = getattr(progress, "start", None)
    if start is not None:
        start(title, total)


def attention_lengths(batches: Iterable[Batch]) -> set[int]:
    """The sequence lengths the block rendering arranges `batches` in (`flex_kernel.sequence_length` of each
    batch's keys, a kept prefix's and its rows'): the graphs a compiled kernel needs for them, known from the
    plan before the first forward (for an adapter whose attention sees whole rows, not a split sequence)."""
    return {sequence_length((0 if b.keeps_prefix else b.prefix_length) + b.n_tokens) for b in batches}

