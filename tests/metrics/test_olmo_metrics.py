"""`inloop_eval.metrics.olmo` against the packages it reproduces, installed here as test-only references:
ai2-olmo-eval 0.9.0's `ICLMetric` (fed the batch dicts and logits OLMo-core feeds it) and OLMo-core 3.0.0's
`EvaluatorCallback` / `DownstreamEvaluator`, which name the figures in W&B.

Synthetic tasks: 2 to 5 choices (one for ce_loss and bpb), exact ties (a choice repeating an earlier one),
unicode continuations (characters != bytes, some starting with a multi-byte character), documents OLMo
skips (a middle choice missing) or scores over fewer choices (the last one missing), and requests repeated
as sampler padding repeats them. Each choice's logits come from a per-document table, so the loglikelihood
of a request is a known value: `-F.cross_entropy(table[:n], tokens, reduction="sum")` in float32, the number
OLMo computes from the same logits.

Bit for bit: every figure of every metric type, when ll is that float32 value and documents reach OLMo in
doc_id order. To 1e-6 relative (accuracies and f1 still exact): ll as this package scores it (float32
log-probabilities summed in float64), and documents reaching OLMo interleaved as from two ranks.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from olmo_core.nn.lm_head import LMOutputWithLoss
from olmo_core.train.callbacks.evaluator_callback import (
    DownstreamEvaluator,
    DownstreamEvaluatorCallbackConfig,
    EvaluatorCallback,
)
from olmo_core.train.train_module import EvalBatchSpec
from olmo_eval.metrics import ICLMetric

from inloop_eval.errors import ConfigError, RequestError, TaskDataError
from inloop_eval.integrations.olmo_core.keys import OLMO_CORE_FIGURE_NAMES, olmo_core_key, olmo_core_metrics
from inloop_eval.metrics.formats import OLMO_METRIC_TYPES
from inloop_eval.metrics.olmo import olmo_figures, olmo_icl_compute

# The reference's own warnings (its torch.tensor(tensor) copies; compute on an empty metric).
pytestmark = [
    pytest.mark.filterwarnings("ignore:To copy construct from a tensor:UserWarning"),
    pytest.mark.filterwarnings("ignore:The ``compute`` method of metric ICLMetric:UserWarning"),
]

VOCAB = 13
MAX_CONT_TOKENS = 4
# 1-, 2-, 3- and 4-byte UTF-8 characters.
ALPHABET = list("abcxyzQ .") + list("éüßñ") + list("中文字") + ["😀"]
MULTI_CHOICE_TYPES = ("acc", "len_norm", "pmi_dc", "f1")
# An OLMo task of each metric type, for the labels in OLMo-core's keys.
TASK_OF_TYPE = {
    "acc": "arc_easy",
    "len_norm": "hellaswag",
    "pmi_dc": "arc_challenge",
    "f1": "mrpc",
    "ce_loss": "arc_easy_ppl",
    "bpb": "mmlu_stem_bpb",
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Every tensor here is tiny: with several OpenMP threads on a busy machine each op waits milliseconds for
    the others."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def random_text(rng: np.random.Generator, *, body_min: int = 1) -> str:
    """A continuation string: mostly " " + a word, sometimes starting with any character (maybe multi-byte)."""
    body = "".join(rng.choice(ALPHABET, size=int(rng.integers(body_min, 7))))
    return " " + body if rng.random() < 0.8 else str(rng.choice(ALPHABET)) + body


def make_requests(seed: int, metric_type: str, n_docs: int = 24, *, body_min: int = 1) -> list[dict]:
    """The requests of a synthetic task, ascending (doc_id, cont_id), each with its logits.

    The logits of a choice's tokens are the first rows of a per-document table, so two choices with the same
    tokens get the same loglikelihood: a choice that repeats an earlier one is an exact tie in every score.
    """
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    requests = []
    for doc_id in range(n_docs):
        n_choices = 1 if metric_type in ("ce_loss", "bpb") else int(rng.integers(2, 6))
        table = torch.randn(MAX_CONT_TOKENS, VOCAB, generator=gen) * 3
        dc_table = torch.randn(MAX_CONT_TOKENS, VOCAB, generator=gen) * 3
        label = int(rng.integers(n_choices))
        choices: list[tuple[str, torch.Tensor]] = []
        for cont_id in range(n_choices):
            if cont_id > 0 and rng.random() < 0.25:
                choices.append(choices[int(rng.integers(cont_id))])
            else:
                n_tokens = int(rng.integers(1, MAX_CONT_TOKENS + 1))
                tokens = torch.as_tensor(rng.integers(0, VOCAB, size=n_tokens), dtype=torch.long)
                choices.append((random_text(rng, body_min=body_min), tokens))
        for cont_id, (text, tokens) in enumerate(choices):
            n = tokens.numel()
            logits, dc_logits = table[:n], dc_table[:n]
            requests.append(
                {
                    "doc_id": doc_id,
                    "cont_id": cont_id,
                    "label": label,
                    "text": text,
                    "tokens": tokens,
                    "logits": logits,
                    "dc_logits": dc_logits,
                    # OLMo's per-request loglikelihoods: float32 cross-entropy sums over the same logits.
                    "ll32": float(-F.cross_entropy(logits, tokens, reduction="sum")),
                    "ll_uncond32": float(-F.cross_entropy(dc_logits, tokens, reduction="sum")),
                    # This package's: float32 log-probabilities summed in float64.
                    "ll64": float(torch.log_softmax(logits, -1).gather(1, tokens[:, None]).double().sum()),
                    "ll_uncond64": float(
                        torch.log_softmax(dc_logits, -1).gather(1, tokens[:, None]).double().sum()
                    ),
                }
            )
    return requests


def drop_choices(requests: list[dict], seed: int) -> list[dict]:
    """Some documents lose a non-gold middle choice (OLMo skips them) or a non-gold last one (OLMo scores
    them over the remaining choices)."""
    rng = np.random.default_rng(seed + 1000)
    n_choices = {}
    for r in requests:
        n_choices[r["doc_id"]] = max(n_choices.get(r["doc_id"], 0), r["cont_id"] + 1)
    dropped = set()
    for doc_id, m in n_choices.items():
        label = next(r["label"] for r in requests if r["doc_id"] == doc_id)
        draw = rng.random()
        if m >= 3 and draw < 0.1 and label != 1:
            dropped.add((doc_id, 1))
        elif m >= 3 and draw < 0.2 and label != m - 1:
            dropped.add((doc_id, m - 1))
    return [r for r in requests if (r["doc_id"], r["cont_id"]) not in dropped]


def arrival_order(requests: list[dict], seed: int) -> list[dict]:
    """Documents in doc_id order, choices shuffled within each, then the first few requests repeated at the
    end as DistributedSampler's padding repeats them."""
    rng = np.random.default_rng(seed + 2000)
    out = []
    for doc_id in sorted({r["doc_id"] for r in requests}):
        doc = [r for r in requests if r["doc_id"] == doc_id]
        out += [doc[i] for i in rng.permutation(len(doc))]
    return out + out[:5]


def olmo_batches(
    requests: list[dict], seed: int, batch_size: int = 7
) -> list[tuple[dict, torch.Tensor, torch.Tensor]]:
    """OLMo's collated batches with the model's logits and its domain-conditional logits.

    Each request's continuation logits sit at the positions OLMo reads (ctx_len - 1 onwards, dc_len - 1
    onwards); every other position holds noise that no figure may depend on.
    """
    rng = np.random.default_rng(seed + 3000)
    gen = torch.Generator().manual_seed(seed + 3000)
    batches = []
    for start in range(0, len(requests), batch_size):
        chunk = requests[start : start + batch_size]
        ctx_len = [int(rng.integers(1, 5)) for _ in chunk]
        dc_len = [int(rng.integers(1, 3)) for _ in chunk]
        width = max(r["tokens"].numel() for r in chunk)
        lm_logits = torch.randn(len(chunk), max(ctx_len) + width, VOCAB, generator=gen) * 5
        dc_logits = torch.randn(len(chunk), max(dc_len) + width, VOCAB, generator=gen) * 5
        continuation = torch.zeros(len(chunk), width, dtype=torch.long)
        for i, r in enumerate(chunk):
            n = r["tokens"].numel()
            continuation[i, :n] = r["tokens"]
            lm_logits[i, ctx_len[i] - 1 : ctx_len[i] - 1 + n] = r["logits"]
            dc_logits[i, dc_len[i] - 1 : dc_len[i] - 1 + n] = r["dc_logits"]
        batch = {
            "doc_id": torch.tensor([r["doc_id"] for r in chunk]),
            "cont_id": torch.tensor([r["cont_id"] for r in chunk]),
            "continuation": continuation,
            "cont_len": torch.tensor([r["tokens"].numel() for r in chunk]),
            "ctx_len": torch.tensor(ctx_len),
            "dc_len": torch.tensor(dc_len),
            # As OLMo's task datasets compute them from the continuation string.
            "cont_str_len": torch.tensor([len(r["text"]) for r in chunk]),
            "cont_byte_len": torch.tensor([len(r["text"].encode("utf-8")) for r in chunk]),
            "cont_str_len_no_leading_space": torch.tensor([len(r["text"]) - 1 for r in chunk]),
            "cont_byte_len_no_leading_space": torch.tensor(
                [len(r["text"][1:].encode("utf-8")) for r in chunk]
            ),
            "label_id": torch.tensor([r["label"] for r in chunk]),
            "input_ids": torch.zeros(len(chunk), lm_logits.shape[1], dtype=torch.long),
        }
        batches.append((batch, lm_logits, dc_logits))
    return batches


def run_olmo(metric_type: str, batches: list[tuple[dict, torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """ai2-olmo-eval's own ICLMetric over the batches (one process: its compute does not sync)."""
    metric = ICLMetric(metric_type=metric_type)
    for batch, lm_logits, dc_logits in batches:
        metric.update(batch, lm_logits, dc_logits)
    return {key: float(value) for key, value in metric.compute().items()}


def run_ours(
    metric_type: str, requests: list[dict], *, ll: str = "ll32", nls_bytes: bool = True
) -> dict[str, float]:
    """olmo_icl_compute over the requests (no repeats), from the fields this package keeps per request."""
    texts = [r["text"] for r in requests]
    return olmo_icl_compute(
        metric_type,
        doc_id_R=torch.tensor([r["doc_id"] for r in requests]),
        cont_id_R=torch.tensor([r["cont_id"] for r in requests]),
        is_gold_R=torch.tensor([r["cont_id"] == r["label"] for r in requests]),
        ll_R=torch.tensor([r[ll] for r in requests], dtype=torch.float64),
        n_chars_R=torch.tensor([len(t) for t in texts]),
        n_bytes_R=torch.tensor([len(t.encode("utf-8")) for t in texts]),
        n_bytes_no_leading_space_R=(
            torch.tensor([len(t[1:].encode("utf-8")) for t in texts]) if nls_bytes else None
        ),
        ll_uncond_R=torch.tensor([r[ll.replace("ll", "ll_uncond")] for r in requests], dtype=torch.float64),
    )


def assert_same(ours: dict[str, float], theirs: dict[str, float], *, rel: float = 0.0) -> None:
    """Same keys in the same order; values bit for bit (rel=0) or to `rel`, accuracies and f1 always exactly."""
    assert list(ours) == list(theirs), f"keys: ours {list(ours)}, OLMo's {list(theirs)}"
    for key, want in theirs.items():
        got = ours[key]
        if math.isnan(want):
            assert math.isnan(got), f"{key}: ours {got!r}, OLMo's NaN"
        elif rel == 0.0 or key.startswith(("acc", "len_norm", "pmi_dc", "f1")):
            assert got == want, f"{key}: ours {got!r}, OLMo's {want!r}"
        else:
            assert math.isclose(got, want, rel_tol=rel), f"{key}: ours {got!r}, OLMo's {want!r}"


def shuffled(requests: list[dict], seed: int) -> list[dict]:
    """The requests in a random order: olmo_icl_compute must not depend on it."""
    rng = np.random.default_rng(seed + 4000)
    return [requests[i] for i in rng.permutation(len(requests))]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("metric_type", OLMO_METRIC_TYPES)
def test_every_figure_bit_for_bit(metric_type: str, seed: int) -> None:
    requests = drop_choices(make_requests(seed, metric_type), seed)
    theirs = run_olmo(metric_type, olmo_batches(arrival_order(requests, seed), seed))
    assert list(theirs) == list(olmo_figures(metric_type))
    assert all(math.isfinite(v) for v in theirs.values())  # the comparison below is of real numbers
    assert_same(run_ours(metric_type, shuffled(requests, seed)), theirs)


def test_cases_exercise_ties_skips_and_f1_classes() -> None:
    """The random cases above contain what they claim: exact ties at the argmax, skipped and shortened
    documents, and f1 predictions of both classes."""
    ties = skipped = shortened = 0
    for seed in range(12):
        requests = make_requests(seed, "acc")
        kept = drop_choices(requests, seed)
        for doc_id in {r["doc_id"] for r in requests}:
            lls = [r["ll32"] for r in requests if r["doc_id"] == doc_id]
            ties += lls.count(max(lls)) > 1
            conts = sorted(r["cont_id"] for r in kept if r["doc_id"] == doc_id)
            skipped += conts != list(range(len(conts)))
            shortened += conts == list(range(len(conts))) and len(conts) < len(lls)
    assert ties >= 5 and skipped >= 5 and shortened >= 5, (ties, skipped, shortened)
    f1 = [run_ours("f1", make_requests(seed, "f1"))["f1_v1"] for seed in range(12)]
    assert all(0.0 < x < 1.0 for x in f1), f1


@pytest.mark.parametrize("metric_type", OLMO_METRIC_TYPES)
def test_float64_loglikelihoods_agree_to_1e6(metric_type: str) -> None:
    """ll as this package scores it differs from OLMo's float32 sum by a few float32 ulps."""
    for seed in range(6):
        requests = drop_choices(make_requests(seed, metric_type), seed)
        theirs = run_olmo(metric_type, olmo_batches(arrival_order(requests, seed), seed))
        assert_same(run_ours(metric_type, requests, ll="ll64"), theirs, rel=1e-6)


@pytest.mark.parametrize("metric_type", OLMO_METRIC_TYPES)
def test_interleaved_arrival_changes_only_rounding(metric_type: str) -> None:
    """Documents reaching OLMo as two ranks' shares concatenated (rank 0's requests 0, 2, 4, ..., then rank
    1's) change the order of OLMo's sums, hence only their rounding."""
    for seed in range(6):
        requests = make_requests(seed, metric_type, n_docs=60)
        order = requests[0::2] + requests[1::2]
        theirs = run_olmo(metric_type, olmo_batches(order, seed))
        assert_same(run_ours(metric_type, requests), theirs, rel=1e-6)


@pytest.mark.parametrize("metric_type", MULTI_CHOICE_TYPES + ("ce_loss", "bpb"))
def test_one_character_continuations(metric_type: str) -> None:
    """A one-character continuation has OLMo's "no leading space" length 0: its v1 CE and score are
    infinite in OLMo, and so here."""
    requests = make_requests(7, metric_type, body_min=0)
    assert any(len(r["text"]) == 1 for r in requests)
    theirs = run_olmo(metric_type, olmo_batches(requests, 7))
    assert_same(run_ours(metric_type, requests), theirs)


@pytest.mark.parametrize("metric_type", ("len_norm", "bpb"))
def test_no_leading_space_bytes_default_to_one_byte_less(metric_type: str) -> None:
    """Without n_bytes_no_leading_space_R, every continuation's first character counts one byte, right for
    OLMo's " answer" continuations."""
    requests = [{**r, "text": " " + r["text"][1:]} for r in make_requests(3, metric_type, n_docs=40)]
    assert any(
        len(r["text"].encode("utf-8")) > len(r["text"]) for r in requests
    )  # multi-byte, after the space
    theirs = run_olmo(metric_type, olmo_batches(requests, 3))
    assert_same(run_ours(metric_type, requests, nls_bytes=False), theirs)


def test_no_documents() -> None:
    """With nothing scored OLMo's means raise ZeroDivisionError (reported here as NaN) and its f1 is 0."""
    for metric_type in OLMO_METRIC_TYPES:
        if metric_type == "f1":
            assert run_olmo("f1", []) == {"f1_v1": 0.0, "f1_v2": 0.0}
        else:
            with pytest.raises(ZeroDivisionError):
                run_olmo(metric_type, [])
        ours = run_ours(metric_type, [])
        assert list(ours) == list(olmo_figures(metric_type))
        if metric_type == "f1":
            assert ours == {"f1_v1": 0.0, "f1_v2": 0.0}
        else:
            assert all(math.isnan(v) for v in ours.values())


def test_figure_names_are_olmo_cores_table() -> None:
    """The table is OLMo-core's, and it names every figure any metric type returns."""
    assert OLMO_CORE_FIGURE_NAMES == DownstreamEvaluator.metric_type_to_label
    returned = {figure for metric_type in OLMO_METRIC_TYPES for figure in olmo_figures(metric_type)}
    assert returned == set(OLMO_CORE_FIGURE_NAMES)
    # OLMo-core's callback config names every downstream evaluator "downstream" (its build is not
    # callable here: it loads a tokenizer from the hub), and perform_eval's prefix defaults to "eval".
    assert 'name="downstream"' in inspect.getsource(DownstreamEvaluatorCallbackConfig.build)
    assert inspect.signature(EvaluatorCallback.perform_eval).parameters["prefix"].default == "eval"


class RecordingTrainer:
    """What `EvaluatorCallback.perform_eval` asks of OLMo-core's trainer: the data-parallel group, a train
    module whose eval_batch returns the model's output, and record_metric. The logits are the batches'."""

    def __init__(self, logits: list[torch.Tensor]) -> None:
        self.dp_process_group = None
        self.train_module = self
        self.logits = list(logits)
        self.recorded: dict[str, float] = {}

    def eval_batch(self, batch: dict, labels: torch.Tensor) -> LMOutputWithLoss:
        del batch, labels
        zero = torch.zeros(())
        return LMOutputWithLoss(logits=self.logits.pop(0), loss=zero, ce_loss=zero, z_loss=None)

    def record_metric(self, name: str, value: torch.Tensor | float, **kwargs: object) -> None:
        self.recorded[name] = float(value)


def olmo_core_evaluator(metric_type: str, batches: list[dict]) -> DownstreamEvaluator:
    """OLMo-core's DownstreamEvaluator for an OLMo task of this metric type, reading these batches (lazy:
    its own data loader, which needs the task data and a tokenizer, is never built)."""
    evaluator = DownstreamEvaluator(
        name="downstream",
        task=TASK_OF_TYPE[metric_type],
        batch_spec=EvalBatchSpec(rank_batch_size=4096),
        tokenizer=None,  # type: ignore[arg-type]
        device=torch.device("cpu"),
        lazy=True,
    )
    evaluator.batches = batches
    evaluator.metric = ICLMetric(metric_type=metric_type)
    return evaluator


@pytest.mark.parametrize("metric_type", ("acc", "len_norm", "f1", "ce_loss", "bpb"))
def test_keys_and_values_as_olmo_core_records_them(metric_type: str) -> None:
    """OLMo-core's EvaluatorCallback.perform_eval, run over the batches: the keys and values it records."""
    requests = make_requests(5, metric_type)
    batches = olmo_batches(arrival_order(requests, 5), 5)
    trainer = RecordingTrainer([lm_logits for _, lm_logits, _ in batches])
    callback = EvaluatorCallback(evaluators=[olmo_core_evaluator(metric_type, [b for b, _, _ in batches])])
    callback.trainer = trainer
    callback.perform_eval()
    recorded = {k: v for k, v in trainer.recorded.items() if k.startswith("eval/")}
    ours = olmo_core_metrics(TASK_OF_TYPE[metric_type], run_ours(metric_type, requests))
    assert list(recorded) == list(ours)
    assert recorded == ours


def test_pmi_dc_keys_and_olmo_core_refusal() -> None:
    """OLMo-core's evaluator passes no domain-conditional logits, so its pmi_dc task stops on ICLMetric's
    assert; fed them directly, its compute_metrics names the figures as olmo_core_key does."""
    requests = make_requests(6, "pmi_dc")
    batches = olmo_batches(requests, 6)
    trainer = RecordingTrainer([lm_logits for _, lm_logits, _ in batches])
    callback = EvaluatorCallback(evaluators=[olmo_core_evaluator("pmi_dc", [b for b, _, _ in batches])])
    callback.trainer = trainer
    with pytest.raises(AssertionError, match="no domain conditional logits"):
        callback.perform_eval()

    evaluator = olmo_core_evaluator("pmi_dc", [])
    for batch, lm_logits, dc_logits in batches:
        evaluator.metric.update(batch, lm_logits, dc_logits)
    named = {f"eval/downstream/{name}": float(v) for name, v in evaluator.compute_metrics().items()}
    assert named == olmo_core_metrics("arc_challenge", run_ours("pmi_dc", requests))
    assert olmo_core_key("arc_challenge", "pmi_dc_v2") == "eval/downstream/arc_challenge (PMI-DC accuracy v2)"


def test_olmo_core_key_examples() -> None:
    assert olmo_core_key("arc_easy_rc_5shot", "len_norm_v1") == (
        "eval/downstream/arc_easy_rc_5shot (length-normalized accuracy)"
    )
    assert olmo_core_key("piqa", "soft_log_v2") == "eval/downstream/piqa (log soft loss v2)"
    with pytest.raises(ConfigError, match=r"figure 'acc_norm' of task 'piqa' has no OLMo-core name"):
        olmo_core_key("piqa", "acc_norm")


def fields(**overrides: torch.Tensor) -> dict[str, torch.Tensor]:
    """Two documents of two choices, doc 0's gold choice 0 and doc 1's choice 1."""
    base = {
        "doc_id_R": torch.tensor([0, 0, 1, 1]),
        "cont_id_R": torch.tensor([0, 1, 0, 1]),
        "is_gold_R": torch.tensor([True, False, False, True]),
        "ll_R": torch.tensor([-1.0, -2.0, -3.0, -1.5], dtype=torch.float64),
        "n_chars_R": torch.tensor([4, 5, 6, 3]),
        "n_bytes_R": torch.tensor([4, 5, 6, 3]),
    }
    return {**base, **overrides}


def test_hand_worked_len_norm() -> None:
    """ll / n_chars: doc 0 scores -0.25 vs -0.4 (gold 0 wins), doc 1 -0.5 vs -0.5 (tie: choice 0, not the
    gold). ce_loss_v2 is the gold's -ll / n_chars: mean(0.25, 0.5)."""
    out = olmo_icl_compute("len_norm", **fields())
    assert out["len_norm_v1"] == out["len_norm_v2"] == 0.5
    assert out["ce_loss_v2"] == 0.375
    # v1 divides by n_chars - 1 in float32 (-ll / 3 rounds), then averages in float64 and rounds again.
    assert out["ce_loss_v1"] == float(np.float32((float(np.float32(1 / 3)) + 0.75) / 2))


def test_errors_name_the_problem() -> None:
    with pytest.raises(ConfigError, match=r"metric_type 'acc_norm' is unknown: expected one of"):
        olmo_icl_compute("acc_norm", **fields())
    with pytest.raises(
        RequestError, match=r"doc 1 cont 0 appears more than once; pass the rows through dedup"
    ):
        olmo_icl_compute("acc", **fields(cont_id_R=torch.tensor([0, 1, 0, 0])))
    with pytest.raises(RequestError, match=r"n_chars_R has shape \(3,\), expected \(4,\)"):
        olmo_icl_compute("acc", **fields(n_chars_R=torch.tensor([1, 2, 3])))
    with pytest.raises(RequestError, match=r"'pmi_dc'\): ll_uncond_R is missing"):
        olmo_icl_compute("pmi_dc", **fields())
    with pytest.raises(RequestError, match=r"doc 0 has cont_id -1, expected a choice index >= 0"):
        olmo_icl_compute("acc", **fields(cont_id_R=torch.tensor([-1, 1, 0, 1])))
    with pytest.raises(
        TaskDataError, match=r"1 documents have not exactly one gold choice \(doc_id: golds \{1: 2\}\)"
    ):
        olmo_icl_compute("f1", **fields(is_gold_R=torch.tensor([True, False, True, True])))
    with pytest.raises(TaskDataError, match=r"doc 0 has 2 requests, expected 1: OLMo's bpb tasks score only"):
        olmo_icl_compute("bpb", **fields())
