"""The output head's arithmetic (`engine/logprobs.py`): greedy flags are `argmax == target` with argmax's
tie-break, from the one read that finds each row's maximum; log-probabilities and flags are those of the plain
two-pass computation (max, log-sum-exp, then argmax where the target reaches the max), chunked or not, in
place or not; and a batch whose targets are on the host is scored without reading anything back from the
device but its scores, once per evaluation.
Legend: C positions, V vocabulary, M targets, P pairs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import two_documents
from torch import Tensor

from inloop_eval.engine import logprobs, scoring
from inloop_eval.engine.adapter import TokenCount
from inloop_eval.engine.batching import BatchShape, plan_batches
from inloop_eval.engine.families import make_adapter
from inloop_eval.engine.logprobs import HostTargets, chunk_bounds, plain_logprobs, row_max
from inloop_eval.engine.outputs import projected_head
from inloop_eval.engine.outputs.sequence_sharded import SequenceShard, sequence_shard_logprobs
from inloop_eval.engine.scoring import pair_sums, run_batches
from inloop_eval.models.gpt import GPT, GPTConfig


def two_pass(logits_CV: Tensor, local_M: Tensor, target_M: Tensor) -> tuple[Tensor, Tensor]:
    """The computation the head replaced: the max, the log-sum-exp, then the full argmax of every row whose
    target reaches the max."""
    max_C = logits_CV.amax(dim=-1)
    logit_M = logits_CV[local_M, target_M]
    reaches_M = logit_M >= max_C[local_M]
    candidates = torch.nonzero(reaches_M)[:, 0]
    reaches_M[candidates] = logits_CV[local_M[candidates]].argmax(dim=-1) == target_M[candidates]
    return logit_M - torch.logsumexp(logits_CV, dim=-1)[local_M], reaches_M


def scored(logits_CV: Tensor, local_M: Tensor, target_M: Tensor, in_place: bool) -> tuple[Tensor, Tensor]:
    return plain_logprobs(logits_CV.clone(), local_M, target_M, in_place=in_place)


@pytest.mark.parametrize("vocab", [5, 1024, 3000])  # one short block, one whole block, blocks and a short one
@pytest.mark.parametrize("in_place", [False, True])
def test_a_tied_maximum_is_greedy_only_at_its_first_index(vocab, in_place):
    """Ties go to the lowest id, as argmax breaks them, also when the tied maxima lie in different blocks
    of a row or in its short last block."""
    last = vocab - 1
    logits_CV = torch.zeros(3, vocab)
    logits_CV[0, [1, last]] = 7.0  # tied: 1 first
    logits_CV[1, [last - 1, last]] = 7.0  # tied at the end of the row
    logits_CV[2] = 7.0  # every id ties: 0 first
    local_M = torch.tensor([0, 0, 1, 1, 2, 2])
    target_M = torch.tensor([1, last, last - 1, last, 0, last])
    _, greedy_M = scored(logits_CV, local_M, target_M, in_place)
    assert greedy_M.tolist() == [True, False, True, False, True, False]
    assert torch.equal(greedy_M, logits_CV[local_M].argmax(dim=-1) == target_M)


@pytest.mark.parametrize("in_place", [False, True])
def test_infinite_logits_give_the_argmax_and_the_two_pass_numbers(in_place):
    """A row of -inf (every id ties: 0 is the argmax) and a row with +inf at two ids (the first wins)."""
    inf = float("inf")
    logits_CV = torch.tensor([[-inf, -inf, -inf, -inf], [0.0, inf, 2.0, inf], [1.0, -inf, 3.0, 2.0]])
    local_M = torch.tensor([0, 0, 1, 1, 1, 2, 2])
    target_M = torch.tensor([0, 2, 1, 3, 0, 2, 1])
    logp_M, greedy_M = scored(logits_CV, local_M, target_M, in_place)
    assert torch.equal(greedy_M, logits_CV[local_M].argmax(dim=-1) == target_M)
    ref_logp_M, ref_greedy_M = two_pass(logits_CV, local_M, target_M)
    assert torch.equal(greedy_M, ref_greedy_M)
    np.testing.assert_array_equal(logp_M.numpy(), ref_logp_M.numpy())  # NaN where the two-pass gives NaN


@pytest.mark.parametrize("in_place", [False, True])
def test_no_target_in_a_row_holding_nan_is_greedy(in_place):
    """argmax points at a row's first NaN; the head calls no target of such a row greedy (as the two-pass
    computation did, and the vocabulary-sharded path does), and the other rows are unaffected."""
    nan = float("nan")
    logits_CV = torch.tensor([[nan, 1.0, 2.0], [0.0, nan, nan], [3.0, 1.0, 2.0]])
    local_M = torch.tensor([0, 0, 1, 1, 2, 2])
    target_M = torch.tensor([0, 2, 1, 0, 0, 1])
    _, greedy_M = scored(logits_CV, local_M, target_M, in_place)
    assert greedy_M.tolist() == [False, False, False, False, True, False]
    assert torch.equal(greedy_M, two_pass(logits_CV, local_M, target_M)[1])


@pytest.mark.parametrize("vocab", [7, 1024, 2500])
def test_the_row_max_and_its_first_index_are_amax_and_argmax(vocab):
    torch.manual_seed(0)
    logits_CV = torch.randint(-2, 3, (64, vocab)).float()  # few values: many ties, within and across blocks
    max_C, first_C = row_max(logits_CV)
    assert torch.equal(max_C, logits_CV.amax(dim=-1)) and torch.equal(first_C, logits_CV.argmax(dim=-1))


@pytest.mark.parametrize("in_place", [False, True])
def test_scores_equal_the_two_pass_computation_bit_for_bit(in_place):
    """Random logits, a few of them raised to tie with the row's maximum, several targets a position."""
    torch.manual_seed(1)
    logits_CV = torch.randn(40, 3000)
    logits_CV[::3, 2999] = logits_CV[::3].amax(dim=-1)  # the max again, in the short last block
    local_M = torch.arange(40).repeat_interleave(4)
    target_M = torch.cat(
        [logits_CV.argmax(dim=-1)[:, None], torch.randint(0, 3000, (40, 2)), torch.full((40, 1), 2999)], dim=1
    ).reshape(-1)
    logp_M, greedy_M = scored(logits_CV, local_M, target_M, in_place)
    ref_logp_M, ref_greedy_M = two_pass(logits_CV, local_M, target_M)
    assert torch.equal(greedy_M, ref_greedy_M) and greedy_M.any() and not greedy_M.all()
    if not in_place:  # the same torch.logsumexp: the same bits; in place, its own (faster) arithmetic
        assert torch.equal(logp_M, ref_logp_M)
    np.testing.assert_allclose(logp_M.numpy(), ref_logp_M.numpy(), atol=1e-5, rtol=0)


def test_chunk_bounds_count_each_chunks_targets():
    position_N = np.array([4, 0, 4, 9, 1, 5])
    assert chunk_bounds(position_N, 10, 4) == [0, 2, 5, 6]  # positions 0 1 | 4 4 5 | 9
    assert chunk_bounds(position_N, 10, 10) == [0, 6]
    assert chunk_bounds(np.zeros(0, dtype=np.int64), 0, 4) == [0]


def test_targets_given_on_the_host_score_as_targets_read_from_the_device(monkeypatch):
    torch.manual_seed(0)
    features_UX, target_N = torch.randn(30, 200), torch.randint(0, 200, (50,))
    position_N = torch.randint(0, 30, (50,))
    monkeypatch.setattr(logprobs, "HEAD_ELEMENTS", 200 * 7)  # 5 chunks
    read = projected_head.token_logprobs(features_UX, lambda f: f, target_N, position_N=position_N)
    host = HostTargets(position_N.numpy(), target_N.numpy())
    monkeypatch.setattr(HostTargets, "read", lambda *a: pytest.fail("targets read back from the device"))
    given = projected_head.token_logprobs(
        features_UX, lambda f: f, target_N, position_N=position_N, host=host
    )
    assert torch.equal(read[0], given[0]) and torch.equal(read[1], given[1])


def test_a_rank_scores_the_targets_of_the_positions_it_holds_and_zeros_the_rest():
    """One rank of a sequence split (no other ranks: nothing to all-reduce), holding positions 3 and 1."""
    torch.manual_seed(0)
    logits_UV = torch.randn(4, 50)
    position_N = torch.tensor([1, 0, 3, 1, 2])
    target_N = torch.tensor([7, 8, 9, int(logits_UV[1].argmax()), int(logits_UV[2].argmax())])
    shard = SequenceShard(logits_UV[[3, 1]], torch.tensor([3, 1]), 4, [])
    logp_N, greedy_N = sequence_shard_logprobs(shard, target_N, 0, position_N)
    held_N = torch.tensor([True, False, True, True, False])
    expected_N = torch.log_softmax(logits_UV, -1)[position_N, target_N]
    np.testing.assert_allclose(logp_N.numpy(), torch.where(held_N, expected_N, 0.0).numpy(), atol=1e-6)
    assert torch.equal(greedy_N, held_N & (logits_UV[position_N].argmax(-1) == target_N))
    assert greedy_N[3] and not greedy_N[4]


def test_pair_sums_add_in_batch_order_as_one_batch_at_a_time():
    rng = np.random.default_rng(0)
    owners = [rng.integers(0, 5, 9) for _ in range(4)]
    logps = [torch.from_numpy(rng.normal(size=9).astype(np.float32) * 1e3) for _ in range(4)]
    greedies = [torch.from_numpy(rng.random(9) > 0.2) for _ in range(4)]
    ll_P, n_bad_P = torch.zeros(5, dtype=torch.float64), torch.zeros(5, dtype=torch.int64)
    for owner_N, logp_N, greedy_N in zip(owners, logps, greedies, strict=True):
        ll_P.index_add_(0, torch.from_numpy(owner_N), logp_N.double())
        n_bad_P.index_add_(0, torch.from_numpy(owner_N), (~greedy_N).long())
    found_ll_P, found_greedy_P = pair_sums(owners, logps, greedies, 5)
    np.testing.assert_array_equal(found_ll_P, ll_P.numpy())
    np.testing.assert_array_equal(found_greedy_P, (n_bad_P == 0).numpy())
    assert [a.size for a in pair_sums([], [], [], 3)] == [3, 3]


def test_a_batch_is_scored_without_reading_the_device_and_copied_to_cpu_without_pinning(monkeypatch):
    """On a CPU model: no target read back from the device, no pinned memory, and the scores of every batch
    copied in one transfer at the end."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=64)).eval()
    pairs = two_documents()
    batches = plan_batches(pairs, np.arange(5), 8, BatchShape(packing=True))
    assert len([b for b in batches if b.pair_N.size]) > 1
    copies = []
    cpu = torch.Tensor.cpu
    monkeypatch.setattr(HostTargets, "read", lambda *a: pytest.fail("targets read back from the device"))
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda *a, **k: pytest.fail("pinned on a CPU machine"))
    monkeypatch.setattr(
        torch.Tensor, "cpu", lambda self, *a, **k: copies.append(self.shape) or cpu(self, *a, **k)
    )
    with torch.inference_mode():
        found = run_batches(make_adapter(model), batches, 5, TokenCount())
    assert copies == [torch.Size([2, sum(b.pair_N.size for b in batches)])]
    monkeypatch.undo()
    with torch.inference_mode():
        single = [run_batches(make_adapter(model), [b], 5, TokenCount()) for b in batches if b.pair_N.size]
    np.testing.assert_array_equal(found.ll, sum(s.ll for s in single))
    assert scoring.to_device(np.arange(3), torch.device("cpu")).tolist() == [0, 1, 2]
