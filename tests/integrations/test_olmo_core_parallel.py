"""The OLMo-core callback when OLMo-core's train module splits the model: tensor parallel (TP=2, FSDP), Ulysses
context parallel (CP=2, DDP) and FSDP=2 x TP=2 (4 processes), each a real `Trainer` run under torchrun on gloo,
compared with one process (tp2 and cp2 one after the other in one 2-process launch): rows packed in every layout (the attention routed through the engine's, under
Ulysses after OLMo-core's head exchange), the same `eval/downstream/...` keys, accuracies identical, the other figures within
1e-5 relative, for an rc, a letter-key mc and a bpb OLMo label and a PMI task, under our keys and OLMo-core's.
Also: the head's scoring allocates at most [C, V/TP] per batch (a chunk of positions on a rank's slice of the vocabulary), tokens are counted once per data-parallel
rank, and sharding over no group or over the world is refused. The worker is
tests/support/workers/olmo_core_layouts.py (one launch per world size)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from workers.launch import REPO, launch, read_ranks, worker_env
from workers.olmo_core_layouts import LAYOUTS, run_layout

from inloop_eval.errors import ConfigError, ModelOutputError
from inloop_eval.integrations.olmo_core.topology import SequenceSplit, read_sequence_split

# The layouts of each launch (of one world size): tp2 and cp2 share one, so their processes start once.
LAUNCHES = [["tp2", "cp2"], ["dp2tp2"]]
LAUNCH_TIMEOUT_S = 400
# Figures that count documents: equal exactly (OLMo-core's keys name accuracies in words).
EXACT = ("/acc", "/acc_norm", "/acc_bytes", "/acc_per_token", "/acc_pmi", "/n_docs", "/failed", "accuracy)", "accuracy v2)")


def downstream(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith("eval/downstream/")}


@pytest.fixture(scope="module")
def single(data_root: Path, tmp_path_factory) -> dict[str, Any]:
    return run_layout("single", tmp_path_factory.mktemp("single"), data_root)


@pytest.fixture(scope="module")
def launched(data_root: Path, tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    """Layout -> every rank's result; the layouts of one world size in one launch."""
    out: dict[str, list[dict[str, Any]]] = {}
    for layouts in LAUNCHES:
        (nproc,) = {LAYOUTS[layout][0] for layout in layouts}
        folder = tmp_path_factory.mktemp("_".join(layouts))
        args = [str(REPO / "tests" / "support" / "workers" / "olmo_core_layouts.py"), "--data-root", str(data_root)]
        args += ["--work", str(folder / "work"), "--out", str(folder / "out"), "--layouts", ",".join(layouts)]
        launch(nproc, args, timeout=LAUNCH_TIMEOUT_S, env=worker_env(OLMO_SHARED_FS="1"))
        out.update({layout: read_ranks(folder / "out" / layout, nproc) for layout in layouts})
    return out


def test_every_layout_gives_the_figures_of_one_process(single, launched) -> None:
    """At startup (the same weights) and after one training step, on every rank of every layout."""
    steps = sorted(single["logged"], key=int)
    assert steps == ["0", "1"]
    for layout, ranks in launched.items():
        for rank, result in enumerate(ranks):
            for step in steps:
                expected, found = downstream(single["logged"][step]), downstream(result["logged"][step])
                where = f"{layout} rank {rank} step {step}"
                assert sorted(found) == sorted(expected), where
                for key, value in expected.items():
                    if key.endswith(EXACT):
                        assert found[key] == value, f"{where}: {key} {found[key]} != {value}"
                    else:
                        assert math.isclose(found[key], value, rel_tol=1e-5), f"{where}: {key}"


def test_every_kind_of_label_and_both_key_styles_are_compared(single) -> None:
    keys = downstream(single["logged"]["0"])
    for label in ("olmo:piqa", "olmo:mmlu_stem_test_mc_5shot_fast", "olmo:arc_easy_test_bpb_5shot"):
        assert f"eval/downstream/{label}/n_docs" in keys  # our keys
    for words in ("piqa (length-normalized accuracy)", "mmlu_stem_test_mc_5shot_fast (length-normalized accuracy)",
                  "arc_easy_test_bpb_5shot (BPB)"):
        assert f"eval/downstream/{words}" in keys  # OLMo-core's keys
    assert "eval/downstream/k_arc_easy_pmi/acc_pmi" in keys


def test_tokens_are_counted_once_per_data_parallel_rank(single, launched) -> None:
    """Tensor and context parallel peers forward the same batches: counted once. The split layouts pack rows
    and keep prefixes as one process does, padded to a multiple of the degree: at least the tokens of one
    process packed, fewer than one process unpacked; FSDP=2 x TP=2 forwards the same batches as TP=2,
    split over two data-parallel ranks, so their totals are within the dummy batches that even out the
    ranks."""
    one_packed = single["evaluator_tokens"]
    one = single["unpacked_evaluator_tokens"]
    tp2_rank = launched["tp2"][0]["evaluator_tokens"]
    assert one_packed <= tp2_rank < one
    tp2 = launched["tp2"][0]["logged"]["0"]["eval/tokens_forwarded"]
    assert launched["cp2"][0]["logged"]["0"]["eval/tokens_forwarded"] == tp2
    assert single["logged"]["0"]["eval/tokens_forwarded"] <= tp2
    dp2tp2 = launched["dp2tp2"][0]["logged"]["0"]["eval/tokens_forwarded"]
    assert 0.9 * tp2 < dp2tp2 < 1.5 * tp2
    for ranks in launched.values():
        assert len({r["logged"]["0"]["eval/tokens_forwarded"] for r in ranks}) == 1


def test_the_head_scores_at_most_a_chunk_of_a_ranks_vocabulary(launched) -> None:
    """Per batch, the largest tensor the head's scoring allocates at TP=2 is at most [C, V/TP], C the positions
    of one chunk (each rank projects the positions read onto its slice of the vocabulary, a chunk at a
    time: no rank holds a batch's logits, nor gathers another rank's)."""
    for result in launched["tp2"]:
        record = result["memory"]
        assert record and all(r["largest"] > 0 for r in record)
        assert all(r["largest"] <= r["bound"] for r in record), max(record, key=lambda r: r["largest"] / r["bound"])


def test_sharding_over_no_group_or_the_world_is_refused(launched) -> None:
    for layout, dim in (("tp2", "tp"), ("cp2", "cp"), ("dp2tp2", "tp")):
        for result in launched[layout]:
            assert "no data-parallel group was given" in result["no_group"], layout
            assert f"splits the peers of the model-parallel dimension ['{dim}']" in result["world_group"], layout


def test_ddp_over_tensor_parallel_is_refused_before_it_has_trained(launched) -> None:
    for result in launched["tp2"]:
        assert "has not run a training forward yet" in result["ddp_tp_startup"]
        assert "DataParallelType.fsdp" in result["ddp_tp_startup"]



def test_a_width_the_layout_cannot_split_is_an_error() -> None:
    layout = SequenceSplit(tp_size=2, cp_size=2)
    assert layout.held(8) == (0, 4)
    assert SequenceSplit(tp_size=2, tp_rank=1, cp_size=2, cp_rank=1).held(8) == (4, 4)
    with pytest.raises(ModelOutputError, match="input width 6 is not a multiple of 4"):
        layout.held(6)


def test_ring_context_parallelism_is_refused() -> None:
    """Ring attention's load balancers interleave chunks; only Ulysses' contiguous chunks are read."""
    ring = type("RingAttentionZigZagLoadBalancer", (), {"cp_rank": 0, "cp_world_size": 2})()
    model = torch.nn.Module()
    model._cp_load_balancer = ring
    with pytest.raises(ConfigError, match="ring context parallelism.*Ulysses"):
        read_sequence_split(model)
    assert read_sequence_split(torch.nn.Module()) is None


def test_a_max_length_the_sequence_split_cannot_take_is_refused_when_the_callback_is_built(launched) -> None:
    """TP=2 with `max_length: 63`: refused when the trainer builds the callback, naming the fix, rather than
    `failed = 1` at every evaluation."""
    for result in launched["tp2"]:
        assert "max_length 63 is not a multiple of 2 (tensor parallel 2 x context parallel 1)" in result["odd_max_length"]
        assert "set the evaluator's max_length to 62" in result["odd_max_length"]

