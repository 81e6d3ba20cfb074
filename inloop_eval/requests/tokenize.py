"""Tokenizing one (context, continuation) pair, as lm-evaluation-harness splits it, or as OLMo's in-loop
tasks encode it (a task's `pair_encoding`). docs/design.md, "Tokenizing a pair", states the rules.
"""


from __future__ import annotations

from collections.abc import Sequence

from inloop_eval.data.tokenizer import TokenizerLike, start_token_id
from inloop_eval.errors import RequestError, TokenizerError


def move_trailing_whitespace(context: str, continuation: str) -> tuple[str, str]:
    """Trailing whitespace of the context goes to the front of the continuation."""
    stripped = context.rstrip()
    return stripped, context[len(stripped) :] + continuation


def split_at_common_prefix(context_ids: Sequence[int], whole_ids: Sequence[int]) -> int:
    """Where the continuation starts in `whole_ids`: the longest common prefix with the context.

    Without a merge across the join this is `len(context_ids)` (lm-evaluation-harness's split); with one,
    the boundary moves left so the continuation is never empty and covers all of its text.
    """
    n = min(len(context_ids), len(whole_ids))
    i = 0
    while i < n and context_ids[i] == whole_ids[i]:
        i += 1
    return i


def _prefix_ids(tokenizer: TokenizerLike) -> tuple[list[int], int | None]:
    """(tokens put before every context, token for an empty context)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return ([int(bos)] if bos is not None else []), start_token_id(tokenizer)


def finish_context(tokenizer: TokenizerLike, ctx_ids: list[int], where: str) -> list[int]:
    prefix, empty = _prefix_ids(tokenizer)
    ctx_ids = prefix + ctx_ids
    if not ctx_ids:
        if empty is None:
            raise TokenizerError(
                f"{where}: the context is empty and the tokenizer has neither BOS nor EOS to start from; "
                "pass a tokenizer with an EOS token"
            )
        ctx_ids = [empty]
    return ctx_ids


def truncation_start(n_context: int, n_continuation: int, max_length: int, where: str) -> int:
    """First context token kept so that context + continuation[:-1] fits `max_length`."""
    if n_continuation > max_length:
        raise RequestError(
            f"{where}: the continuation has {n_continuation} tokens but the model's context length is "
            f"{max_length}; a continuation is never truncated: raise max_length or drop the document"
        )
    keep = max_length - n_continuation + 1
    return max(0, n_context - keep)


def tokenize_pair(
    tokenizer: TokenizerLike, context: str, continuation: str, where: str = "request"
) -> tuple[list[int], int, list[int]]:
    """Tokenize one pair whose context has no trailing whitespace (see `move_trailing_whitespace`).

    Returns (full context ids, how many of them precede the continuation, continuation ids). The context
    ids are `encode(context)` with BOS in front, so pairs with one context share them.
    """
    ctx_ids = list(tokenizer.encode(context)) if context else []
    whole = list(tokenizer.encode(context + continuation))
    split = split_at_common_prefix(ctx_ids, whole)
    cont_ids = whole[split:]
    if not cont_ids:
        raise RequestError(f"{where}: continuation {continuation!r} encodes to no tokens")
    full_ctx = finish_context(tokenizer, ctx_ids, where)
    n_before = split + len(full_ctx) - len(ctx_ids)
    if n_before == 0:  # the whole context merged into the continuation: start from BOS/EOS
        full_ctx = finish_context(tokenizer, [], where)
        n_before = len(full_ctx)
    return full_ctx, n_before, cont_ids


def tokenize_pair_olmo(
    tokenizer: TokenizerLike, context: str, continuation: str, where: str = "request"
) -> tuple[list[int], list[int]]:
    """OLMo's in-loop encoding (ai2-olmo-eval's `prep_examples`): (context ids, continuation ids), each string
    encoded on its own exactly as given (no whitespace moved, no merge across the join), the tokenizer's BOS
    put before the context unless it already starts with it."""
    ctx_ids = list(tokenizer.encode(context))
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and (not ctx_ids or ctx_ids[0] != bos):
        ctx_ids = [int(bos), *ctx_ids]
    if not ctx_ids:
        raise RequestError(
            f"{where}: context {context!r} encodes to no tokens and the tokenizer has no BOS; OLMo's "
            "encoding needs a context token to predict the continuation from: give the document a context"
        )
    cont_ids = list(tokenizer.encode(continuation))
    if not cont_ids:
        raise RequestError(f"{where}: continuation {continuation!r} encodes to no tokens")
    return ctx_ids, cont_ids


def olmo_uncond_context(tokenizer: TokenizerLike, text: str, where: str = "request") -> list[int]:
    """OLMo's unconditional ("domain conditional") context: `text` encoded as given, without BOS."""
    ids = list(tokenizer.encode(text))
    if not ids:
        raise RequestError(
            f"{where}: unconditional context {text!r} encodes to no tokens; OLMo's PMI scores the "
            "continuation after at least one token: give the task a non-empty unconditional context"
        )
    return ids


def encode_pair(
    tokenizer: TokenizerLike, context: str, continuation: str, max_length: int, where: str = "request"
) -> tuple[list[int], list[int]]:
    """Tokenize one pair: (context ids after truncation, continuation ids). See docs/design.md, "Tokenizing a pair"."""
    context, continuation = move_trailing_whitespace(context, continuation)
    full_ctx, n_before, cont_ids = tokenize_pair(tokenizer, context, continuation, where)
    start = truncation_start(n_before, len(cont_ids), max_length, where)
    return full_ctx[start:n_before], cont_ids


