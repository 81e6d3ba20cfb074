"""Splitting (context, continuation) pairs into tokens with the real GPT-NeoX BPE (docs/design.md, "Tokenizing a pair")."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest

from inloop_eval.data.root import load_split, neox_tokenizer_path
from inloop_eval.data.tokenizer import Tokenizer, load_tokenizer
from inloop_eval.errors import RequestError
from inloop_eval.requests.tokenize import encode_pair

MAX_LENGTH = 2048


@pytest.fixture(scope="module")
def neox(data_root: Path) -> Tokenizer:
    return load_tokenizer(neox_tokenizer_path(data_root))


@pytest.fixture(scope="module")
def neox_bos(data_root: Path) -> Tokenizer:
    """The same vocabulary with a BOS token (`<|padding|>`, id 1), to see BOS handling."""
    tok = load_tokenizer(neox_tokenizer_path(data_root), bos_token="<|padding|>")
    assert tok.bos_token_id == 1
    return tok


def harness_split(tok: Tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-evaluation-harness's `_encode_pair`: move trailing whitespace, split at the context's length."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tok.encode(context + continuation)
    n_context = len(tok.encode(context))
    return whole[:n_context], whole[n_context:]


def merges_across_join(tok: Tokenizer, context: str, continuation: str) -> bool:
    return tok.encode(context) + tok.encode(continuation) != tok.encode(context + continuation)


@pytest.mark.parametrize(
    ("context", "continuation"),
    [
        ("The capital of France is", " Paris"),
        ("Question: What is 1+1?\nAnswer:", " 2"),
        ("x = 1", "."),
        ("Answer:\n", "\nyes"),
        ("www.google", ".com"),
        ("don", "'t"),
    ],
)
def test_ordinary_join_matches_harness(neox: Tokenizer, context: str, continuation: str) -> None:
    ctx, cont = encode_pair(neox, context, continuation, MAX_LENGTH)
    assert (ctx, cont) == harness_split(neox, context, continuation)
    # No BOS in NeoX: the context is exactly its own encoding.
    assert ctx + cont == neox.encode(context + continuation)


def test_capital_of_france_tokens(neox: Tokenizer) -> None:
    ctx, cont = encode_pair(neox, "The capital of France is", " Paris", MAX_LENGTH)
    assert ctx == [510, 5347, 273, 6181, 310]
    assert cont == [7785]
    assert neox.decode(cont) == " Paris"


def test_trailing_whitespace_of_context_moves_to_continuation(neox: Tokenizer) -> None:
    # encode("Answer: ") ends in a lone space token; moved, the space joins "yes" as one token " yes".
    assert neox.encode("Answer: ")[-1] == neox.encode(" ")[0]
    ctx, cont = encode_pair(neox, "Answer: ", "yes", MAX_LENGTH)
    assert ctx == neox.encode("Answer:")
    assert cont == neox.encode(" yes") == [4754]
    assert (ctx, cont) == encode_pair(neox, "Answer:", " yes", MAX_LENGTH)
    # Newlines are whitespace too.
    ctx, cont = encode_pair(neox, "Answer:\n", "yes", MAX_LENGTH)
    assert ctx == neox.encode("Answer:")
    assert neox.decode(cont) == "\nyes"


def test_whitespace_at_start_of_continuation_stays_there(neox: Tokenizer) -> None:
    ctx, cont = encode_pair(neox, "Answer:", "  yes", MAX_LENGTH)
    assert ctx == neox.encode("Answer:")
    assert neox.decode(cont) == "  yes"
    ctx, cont = encode_pair(neox, "end.", "\n\nThe next", MAX_LENGTH)
    assert ctx == neox.encode("end.")
    assert neox.decode(cont) == "\n\nThe next"


@pytest.mark.parametrize(
    ("context", "continuation"),
    [
        ("The cat", "s"),  # " cat" + "s" -> " cats"
        ('I said "', '"'),  # ' "' + '"' -> ' ""'
        ("He said hel", "lo"),  # " hel" + "lo" -> " hello"
        ("x = (", ")"),  # "(" + ")" -> "()"
    ],
)
def test_merge_across_join(neox: Tokenizer, context: str, continuation: str) -> None:
    assert merges_across_join(neox, context, continuation)
    _, harness_cont = harness_split(neox, context, continuation)
    ctx, cont = encode_pair(neox, context, continuation, MAX_LENGTH)
    assert cont, "the continuation must never be empty"
    assert neox.decode(cont).endswith(continuation)
    assert ctx + cont == neox.encode(context + continuation)
    assert len(ctx) >= 1
    assert len(cont) >= len(harness_cont)


def test_merge_across_join_is_a_wrong_split_for_the_harness(neox: Tokenizer) -> None:
    # The harness's split loses the continuation here: "cats" is one token where the context ends.
    _, harness_cont = harness_split(neox, "The cat", "s")
    assert harness_cont == []
    ctx, cont = encode_pair(neox, "The cat", "s", MAX_LENGTH)
    assert ctx == neox.encode("The")
    assert neox.decode(cont) == " cats"


def test_whole_context_merges_into_continuation(neox: Tokenizer, neox_bos: Tokenizer) -> None:
    # "hel" + "lo" -> "hello": one token, so the context keeps no token of its own and starts from EOS.
    assert neox.encode("hel" + "lo") == [neox.encode("hello")[0]]
    ctx, cont = encode_pair(neox, "hel", "lo", MAX_LENGTH)
    assert ctx == [neox.eos_token_id]
    assert neox.decode(cont) == "hello"
    ctx, cont = encode_pair(neox_bos, "hel", "lo", MAX_LENGTH)
    assert ctx == [neox_bos.bos_token_id]
    assert neox_bos.decode(cont) == "hello"


def test_bos_is_prepended(neox: Tokenizer, neox_bos: Tokenizer) -> None:
    for context, continuation in [
        ("The capital of France is", " Paris"),
        ("The cat", "s"),
        ("Answer: ", "no"),
    ]:
        plain = encode_pair(neox, context, continuation, MAX_LENGTH)
        with_bos = encode_pair(neox_bos, context, continuation, MAX_LENGTH)
        assert with_bos == ([1, *plain[0]], plain[1])


def test_empty_context_becomes_prefix_token(neox: Tokenizer, neox_bos: Tokenizer) -> None:
    assert encode_pair(neox, "", " Paris", MAX_LENGTH) == ([0], [7785])  # EOS: NeoX has no BOS
    assert encode_pair(neox_bos, "", " Paris", MAX_LENGTH) == ([1], [7785])
    # A context of only whitespace is empty once the whitespace moves.
    assert encode_pair(neox, "  ", "Paris", MAX_LENGTH) == ([0], neox.encode("  Paris"))


def test_left_truncation_keeps_whole_continuation(neox: Tokenizer) -> None:
    context = " ".join(f"word{i}" for i in range(200))
    continuation = " and the final answer is forty two"
    full_ctx, full_cont = encode_pair(neox, context, continuation, MAX_LENGTH)
    assert len(full_ctx) > 100
    max_length = 50
    ctx, cont = encode_pair(neox, context, continuation, max_length)
    assert cont == full_cont
    assert ctx == full_ctx[len(full_ctx) - len(ctx) :], "truncation must keep the last context tokens"
    # As the harness: the model reads (context + continuation)[:-1], which must fit max_length.
    assert len(ctx) + len(cont) - 1 == max_length


def test_no_truncation_at_exact_fit(neox: Tokenizer) -> None:
    context, continuation = "The capital of France is", " Paris"
    ctx, cont = encode_pair(neox, context, continuation, MAX_LENGTH)
    fit = len(ctx) + len(cont) - 1
    assert encode_pair(neox, context, continuation, fit) == (ctx, cont)
    shorter = encode_pair(neox, context, continuation, fit - 1)
    assert shorter == (ctx[1:], cont)


def test_truncation_drops_bos_from_the_left(neox_bos: Tokenizer) -> None:
    ctx, cont = encode_pair(neox_bos, "one two three four five", " six", MAX_LENGTH)
    assert ctx[0] == 1
    short_ctx, short_cont = encode_pair(neox_bos, "one two three four five", " six", 3)
    assert short_cont == cont
    assert short_ctx == ctx[-3:]


def test_continuation_filling_max_length_keeps_one_context_token(neox: Tokenizer) -> None:
    continuation = " one two three four"
    n = len(neox.encode(continuation))
    ctx, cont = encode_pair(neox, "Count: zero", continuation, n)
    assert cont == neox.encode(continuation)
    assert len(ctx) == 1


def test_too_long_continuation_raises(neox: Tokenizer) -> None:
    continuation = " one two three four five six seven eight nine ten"
    n = len(neox.encode(continuation))
    assert n == 10
    with pytest.raises(RequestError) as info:
        encode_pair(neox, "Count:", continuation, n - 1)
    message = str(info.value)
    assert f"{n} tokens" in message
    assert str(n - 1) in message


def test_too_long_continuation_error_names_where(neox: Tokenizer) -> None:
    with pytest.raises(RequestError, match="task 'piqa' doc 17"):
        encode_pair(neox, "Count:", " one two three", 2, where="task 'piqa' doc 17")


def test_real_task_pairs_cover_their_text(neox: Tokenizer, data_root: Path) -> None:
    """Over real PIQA prompts: tokens always rejoin to the whole text, and agree with the harness when it
    gives a valid split."""
    docs = load_split("piqa", "plain_text", "validation", data_root=data_root).select(range(300))
    n_checked = 0
    for doc in docs:
        context = f"Question: {doc['goal']}\nAnswer:"
        for solution in (doc["sol1"], doc["sol2"]):
            continuation = f" {solution}"
            ctx, cont = encode_pair(neox, context, continuation, MAX_LENGTH)
            assert cont
            assert ctx + cont == neox.encode(context + continuation)
            assert neox.decode(cont).endswith(unicodedata.normalize("NFC", continuation))  # NeoX applies NFC
            harness_ctx, harness_cont = harness_split(neox, context, continuation)
            if harness_ctx == neox.encode(context.rstrip()):
                assert (ctx, cont) == (harness_ctx, harness_cont)
                n_checked += 1
    assert n_checked > 500
