"""The evaluator on a Megatron-core `GPTModel` in its training layouts (megatron-core 0.16.1 on CPU, gloo, under
torchrun): TP=2, TP=2 with sequence parallelism, PP=2, PP=2 with two virtual stages per rank, TP=2 x PP=2 with
sequence parallelism, and DP=2 x TP=2, fed packed rows (prefix tries), give the figures of the same weights in
one process on one request per row (accuracies identical, greedy flags identical, other figures and per-request
loglikelihoods within 1e-5) on an rc, a letter-key, a PMI and a 5-shot task and perplexity domains; so does a
RoPE model with tied output weights and grouped-query attention, packed below a kept prefix, in every layout,
with the mask rendered dense or block; models with an attention the packed routing was not verified for (a
sliding window, another core attention) are given one request per row, said once in the log with the module's
path; the scoring allocates at most [positions, V/TP]; training through Megatron's schedule is bit for bit the
same with evaluations; a stage that raises fails the task on every rank; layouts it cannot score, and a
data-parallel group that splits model-parallel peers, are refused.

Three launches of tests/support/megatron_checks.py: one process (train two steps, save the weights, evaluate
them unsplit through the engine's plain-logits path: the reference; the same for the RoPE model, and its packed
figures with either rendering), two and four processes (the layouts).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import assert_same_metrics
from workers.launch import REPO, launch, read_ranks, worker_env

from inloop_eval.errors import ConfigError
from inloop_eval.integrations.megatron.forward import micro_batches
from inloop_eval.integrations.megatron.topology import MegatronTopology, read_topology, unwrap_gpt

WORKER = REPO / "tests" / "support" / "megatron_checks.py"
LAUNCHES: dict[int, list[str]] = {
    1: ["reference"],
    2: ["layouts", "stage_failure", "refusals"],
    4: ["layouts", "training"],
}
LAYOUTS = {2: ["tp2", "tp2sp", "pp2", "pp2vp2"], 4: ["tp2pp2", "dp2tp2"]}
LAUNCH_TIMEOUT_S = 400
VOCAB = 50304


def request_key(sample: dict[str, Any]) -> tuple[str, int, int]:
    return sample["task"], sample["doc_id"], sample["cont_id"]


@pytest.fixture(scope="module")
def launched(data_root: Path, tmp_path_factory) -> dict[int, list[dict[str, Any]]]:
    """World size -> every rank's results; the one-process launch first (it saves the weights)."""
    weights = tmp_path_factory.mktemp("weights") / "gpt.pt"
    out: dict[int, list[dict[str, Any]]] = {}
    for nproc, checks in LAUNCHES.items():
        folder = tmp_path_factory.mktemp(f"ws{nproc}")
        args = [str(WORKER), "--data-root", str(data_root), "--out", str(folder), "--checks", ",".join(checks)]
        env = worker_env(INLOOP_EVAL_HOME=str(folder / "home"), MEGATRON_WEIGHTS=str(weights))
        launch(nproc, args, timeout=LAUNCH_TIMEOUT_S, env=env)
        out[nproc] = read_ranks(folder, nproc)
    return out


@pytest.fixture(scope="module")
def reference(launched) -> dict[str, Any]:
    return launched[1][0]["reference"]


def layout_results(launched) -> list[tuple[str, int, dict[str, Any]]]:
    """(layout, rank, result) of every layout on every rank."""
    return [
        (name, rank, result["layouts"][name])
        for nproc, names in LAYOUTS.items()
        for rank, result in enumerate(launched[nproc])
        for name in names
    ]


def test_the_reference_covers_rc_letter_key_pmi_bpb_and_perplexity(reference) -> None:
    keys = reference["metrics"]
    for key in ("copa/acc", "copa/bpb_gold", "mmlu_mc/acc", "arc_easy/acc_pmi", "olmo:arc_easy_rc_5shot/acc"):
        assert f"eval/downstream/{key}" in keys
    assert {"eval/lm/code/ppl", "eval/lm/prose/bpb", "eval/lm/tiny/ce"} <= set(keys)
    # Letter keys: every choice of an mmlu_mc document is one token predicted by the same position.
    assert any(s["task"] == "mmlu_mc" for s in reference["samples"])


def test_every_layout_gives_the_figures_of_one_process(reference, launched) -> None:
    results = layout_results(launched)
    assert {name for name, _, _ in results} == {n for names in LAYOUTS.values() for n in names}
    for name, rank, result in results:
        assert_same_metrics(result["metrics"], reference["metrics"], f"{name} rank {rank}", 1e-5)


def assert_same_requests(found: list[dict[str, Any]], expected: list[dict[str, Any]], where: str) -> None:
    """Every request found has the loglikelihoods (within 1e-5) and greedy flag of the one expected."""
    by_key = {request_key(s): s for s in expected}
    for s in found:
        ref = by_key[request_key(s)]
        assert s["is_greedy"] == ref["is_greedy"], (where, s, ref)
        assert math.isclose(s["ll"], ref["ll"], rel_tol=1e-5, abs_tol=1e-5), (where, s, ref)
        # Every record carries its unconditional loglikelihood, even where another data-parallel rank
        # scored that unconditional request.
        assert (s["ll_uncond"] is None) == (ref["ll_uncond"] is None), (where, s, ref)
        if ref["ll_uncond"] is not None:
            assert math.isclose(s["ll_uncond"], ref["ll_uncond"], rel_tol=1e-5, abs_tol=1e-5), (where, s)


def test_every_request_gets_the_loglikelihood_of_one_process(reference, launched) -> None:
    for name, rank, result in layout_results(launched):
        assert_same_requests(result["samples"], reference["samples"], f"{name} rank {rank}")


def test_a_rope_model_packed_below_kept_prefixes_gives_in_every_layout_the_numbers_of_one_process(
    reference, launched
) -> None:
    """RoPE rotates each token at its own position and the core attention runs through the engine's tree
    attention, after the kept prefix's keys and values: per request the one-process figures, in every layout,
    output weights tied and 4 query heads over 2 key/value heads."""
    expected = reference["rope"]
    for name, rank, result in layout_results(launched):
        rope = result["rope"]
        assert_same_requests(rope["samples"], expected["samples"], f"RoPE {name} rank {rank}")
        assert_same_metrics(rope["metrics"], expected["metrics"], f"RoPE {name} rank {rank}", 1e-5)
        batches = rope["batches"]
        assert 0 < batches["packed"] < batches["all"], (name, rank, batches)
        assert batches["keeps_prefix"] > 0 and batches["after_prefix"] > 0, (name, rank, batches)


def test_dense_and_block_renderings_of_the_mask_give_the_same_numbers(reference) -> None:
    """One process, the RoPE model packed through MegatronAdapter with the mask rendered dense (SDPA) and as
    a FlexAttention block mask: the one-process figures of one request per row, either way."""
    renderings = reference["rope_renderings"]
    assert set(renderings) == {"dense", "block"}
    for rendering, result in renderings.items():
        assert result["batches"]["packed"] > 0 and result["batches"]["after_prefix"] > 0, rendering
        assert_same_requests(result["samples"], reference["rope"]["samples"], rendering)
        assert_same_metrics(result["metrics"], reference["rope"]["metrics"], rendering, 1e-5)
    assert_same_requests(renderings["block"]["samples"], renderings["dense"]["samples"], "block vs dense")


def test_every_layout_is_fed_packed_rows(launched) -> None:
    for name, rank, result in layout_results(launched):
        batches = result["batches"]
        assert 0 < batches["packed"] <= batches["all"], (name, rank, batches)


def test_models_with_an_attention_the_routing_was_not_verified_for_are_not_packed_said_once(launched) -> None:
    for result in launched[2]:
        refusals = result["refusals"]
        blockers = refusals["packing_blockers"]
        assert blockers["rope"] == ""
        window = "its sliding-window core attention at 'decoder.layers.0.self_attention.core_attention'"
        core = "its core attention UnverifiedCoreAttention at 'decoder.layers.1.self_attention.core_attention'"
        assert blockers["window"].startswith(window) and blockers["core"].startswith(core)
        # Two adapters of the model with the other core attention: one line.
        assert [line for line in refusals["log"] if core in line] == [
            f"Megatron GPTModel: scoring one request per row, no shared contexts: {blockers['core']}"
        ]


def test_model_parallel_peers_hold_the_same_scores_and_data_parallel_ranks_split_the_documents(
    reference, launched
) -> None:
    expected = {request_key(s) for s in reference["samples"]}
    for nproc, names in LAYOUTS.items():
        for name in names:
            by_dp: dict[int, list[list[dict[str, Any]]]] = {}
            for result in launched[nproc]:
                out = result["layouts"][name]
                by_dp.setdefault(out["ranks"]["dp"], []).append(out["samples"])
            for peers in by_dp.values():
                assert all(p == peers[0] for p in peers), name
            held = [{request_key(s) for s in peers[0]} for peers in by_dp.values()]
            assert set().union(*held) == expected, name
            if len(held) == 2:  # DP=2 x TP=2: each data-parallel rank a part of the documents
                assert held[0] != held[1] and held[0] and held[1]


def test_tokens_forwarded_are_the_schedules_padded_micro_batches(launched) -> None:
    """Every rank of a model-parallel group forwards the same padded batches: under sequence parallelism
    widths a multiple of TP (the planner's), pipeline parallelism rows whole micro-batches."""
    for nproc, names in LAYOUTS.items():
        for name in names:
            tokens = {r["layouts"][name]["ranks"]["dp"]: set() for r in launched[nproc]}
            for r in launched[nproc]:
                tokens[r["layouts"][name]["ranks"]["dp"]].add(r["layouts"][name]["tokens_scored"])
            assert all(len(t) == 1 and min(t) > 0 for t in tokens.values()), (name, tokens)


def test_scoring_allocates_at_most_the_positions_by_the_vocabulary_slice(launched) -> None:
    """Per micro-batch, the largest tensor the last stage's scoring allocates is at most [U, V/TP] (U the
    positions the batch reads): the vocabulary is never gathered."""
    for name, rank, result in layout_results(launched):
        record = result["memory"]
        if result["ranks"]["pp"] == 0 and name.startswith(("pp2", "tp2pp2")):
            assert record == [], name  # the first stage scores nothing
            continue
        assert record, (name, rank)
        width = VOCAB // 2 if "tp2" in name else VOCAB
        assert all(r["width"] == width for r in record), name
        assert all(0 < r["largest"] <= r["bound"] for r in record), (name, max(record, key=lambda r: r["largest"]))


def test_training_through_megatrons_schedule_is_unchanged_by_evaluations(reference, launched) -> None:
    """The RoPE model (its evaluation forwards routed) at TP=2 x PP=2 with sequence parallelism and dropout,
    evaluating at steps 0 and 2 through the same schedule, every forward drawing from the global RNGs and
    Megatron's RNG tracker: the same losses, weights and tracker states bit for bit; the first evaluation gives
    the one-process figures."""
    for rank, result in enumerate(launched[4]):
        runs = result["training"]
        assert runs["with_eval"]["losses"] == runs["without"]["losses"], f"rank {rank}"
        assert runs["with_eval"]["params"] == runs["without"]["params"], f"rank {rank}"
        assert runs["with_eval"]["rng_tracker"] == runs["without"]["rng_tracker"], f"rank {rank}"
        assert runs["with_eval"]["training"] is True
        assert_same_metrics(runs["with_eval"]["metrics"], reference["train_tasks"], f"rank {rank}", 1e-5)
    last_stage_losses = launched[4][2]["training"]["without"]["losses"]
    assert all(loss > 0 for loss in last_stage_losses) and len(set(last_stage_losses)) == len(last_stage_losses)


def test_a_stage_that_raises_fails_the_task_on_every_rank(launched) -> None:
    """The first stage raises in its third forward (packed, routed): both stages raise its error (strict), or
    report the task failed, and the launch ends (no stage left waiting in a receive); no routing override is
    left on either stage."""
    errors = [r["stage_failure"]["strict"] for r in launched[2]]
    assert errors[0] == errors[1] and "Megatron stage 0: RuntimeError: boom in the first stage" in errors[0]
    assert "rotary_pos_emb" in launched[2][0]["stage_failure"]["routed_when_raised"]
    for result in launched[2]:
        assert result["stage_failure"]["lenient"] == {"eval/downstream/copa/failed": 1.0}
        assert result["stage_failure"]["overrides_left"] == []


def test_routing_is_removed_after_a_keyboard_interrupt(launched) -> None:
    """Inside its attention route the RoPE and every core attention hold an override; after a KeyboardInterrupt
    raised in its body none does."""
    for result in launched[2]:
        interrupted = result["refusals"]["interrupted"]
        cores = [f"decoder.layers.{i}.self_attention.core_attention" for i in range(4)]
        assert sorted(interrupted["inside"]) == sorted(["rotary_pos_emb", *cores])
        assert interrupted["after"] == []


def test_peers_must_share_a_data_parallel_rank(launched) -> None:
    for nproc, name, dims in ((2, "tp2", "['tensor']"), (4, "tp2pp2", "['tensor', 'pipeline']")):
        for result in launched[nproc]:
            out = result["layouts"][name]
            assert "no data-parallel group was given" in out["no_group"], name
            assert f"splits the peers of the model-parallel dimension {dims}" in out["world_group"], name


def test_context_parallelism_is_refused_naming_transformer_engine(launched) -> None:
    for result in launched[2]:
        message = result["refusals"]["cp"]
        assert "context parallelism (2 ranks) cannot be evaluated" in message
        assert "Transformer Engine" in message and "never run here" in message


def test_a_module_that_is_not_a_gpt_model_is_refused() -> None:
    with pytest.raises(ConfigError, match="expected a megatron.core GPTModel.*found Linear"):
        unwrap_gpt(torch.nn.Linear(2, 2))
    with pytest.raises(ConfigError, match="no model chunks"):
        read_topology([])


def _layout(**overrides: Any) -> MegatronTopology:
    fields: dict[str, Any] = dict(
        tp_group=None, tp_size=1, tp_rank=0, pp_group=None, pp_size=1, pp_rank=0, n_chunks=1,
        sequence_parallel=False, microbatch_group=1, vocab_size=VOCAB, max_length=64, hidden_size=32,
        packing_blocker="",
    )
    return MegatronTopology(**{**fields, **overrides})


@pytest.mark.parametrize(
    ("layout", "rows", "n_rows", "shape", "per_micro"),
    [
        (_layout(), None, 5, (5, 7), 5),  # one micro-batch without a pipeline
        (_layout(pp_size=2), None, 5, (6, 7), 3),  # the batch split over the stages
        (_layout(pp_size=2), None, 1, (2, 7), 1),  # fewer rows than stages: a row of padding
        (_layout(pp_size=2, n_chunks=2, microbatch_group=4), 2, 5, (8, 7), 2),  # interleaved: groups of 4
    ],
)
def test_micro_batches_have_the_shape_the_schedule_needs(layout, rows, n_rows, shape, per_micro) -> None:
    ids = torch.arange(n_rows * 7).reshape(n_rows, 7)
    padded, found = micro_batches(ids, layout, rows, pad_id=-1)
    assert tuple(padded.shape) == shape and found == per_micro
    assert torch.equal(padded[:n_rows, :7], ids)
    assert (padded[n_rows:] == -1).all() and (padded[:, 7:] == -1).all()


def test_micro_batches_under_sequence_parallelism_take_the_planners_widths_as_they_are() -> None:
    """The planner makes every width a multiple of TP (`AdapterNeeds.width_multiple`, a kept prefix's row
    included): a batch of such a width is cut over TP as it is, one of another width is refused."""
    layout = _layout(tp_size=2, sequence_parallel=True)
    padded, _ = micro_batches(torch.arange(40).reshape(5, 8), layout, None, pad_id=-1)
    assert tuple(padded.shape) == (5, 8)
    with pytest.raises(ValueError, match="width 7 under sequence parallelism needs a width that is a multiple of 2"):
        micro_batches(torch.arange(35).reshape(5, 7), layout, None, pad_id=-1)
