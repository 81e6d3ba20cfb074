"""`icl_compute` and `ICLMetric` (one process) against the independent NumPy reference in tests/reference.py.

Randomized cases cover 2 to 5 choices, several golds, exact ties, unicode choices (chars != bytes), shuffled and
padded (duplicated) rows, documents missing a request (the last one included), non-finite scores, and
unconditional results shared by several requests; small hand-worked cases check the reference itself.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from reference import (
    ACCURACIES,
    ALIASES,
    FIELDS,
    GOLD_FIGURES,
    PREDICTION_FIGURES,
    ZERO_ONE,
    expected_calibration_error,
    f1_score,
    mean_stderr,
    reference_icl,
)

from inloop_eval.metrics.formats import (
    GREEDY_METRICS,
    LENGTH_NORM_METRICS,
    METRICS_BY_FORMAT,
    OLMO_METRIC_TYPES,
)
from inloop_eval.metrics.icl import REQUEST_FIELDS, icl_compute
from inloop_eval.metrics.icl_metric import ICLMetric
from inloop_eval.metrics.olmo import olmo_figures
from inloop_eval.metrics.registry import METRICS, needs_uncond

ALL_METRICS = ZERO_ONE + GOLD_FIGURES + PREDICTION_FIGURES + tuple(ALIASES)
COUNTS = ("n_docs", "n_skipped_docs", "n_nonfinite_docs")
# 1-, 2-, 3- and 4-byte UTF-8 characters, so that n_chars and n_bytes disagree.
ALPHABET = list("abcxyz Q") + list("éüßñ") + list("中文字") + ["😀", "🎉"]
LN2 = math.log(2)


def to_tensors(rows: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    out = {}
    for name in FIELDS:
        if name == "ll":
            out[name] = torch.as_tensor(rows[name], dtype=torch.float64)
        elif name in ("is_gold", "is_greedy"):
            out[name] = torch.as_tensor(rows[name], dtype=torch.bool)
        else:
            out[name] = torch.as_tensor(rows[name], dtype=torch.int64)
    return out


def run_icl(rows, uids, ulls, metrics) -> dict[str, float]:
    return icl_compute(
        to_tensors(rows),
        torch.as_tensor(uids, dtype=torch.int64),
        torch.as_tensor(ulls, dtype=torch.float64),
        metrics,
    )


def assert_matches(found: dict[str, float], expected: dict[str, float]) -> None:
    """Counts and accuracies exactly, everything else to 1e-9 (NaN only matches NaN)."""
    assert set(found) == set(expected), f"keys: found {sorted(found)}, expected {sorted(expected)}"
    for key, want in expected.items():
        got = float(found[key])
        if key in COUNTS or key in ACCURACIES:
            assert got == want or (math.isnan(got) and math.isnan(want)), (
                f"{key}: found {got}, expected {want}"
            )
        elif math.isnan(want):
            assert math.isnan(got), f"{key}: found {got}, expected NaN"
        else:
            assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9), (
                f"{key}: found {got!r}, expected {want!r}"
            )


def rows_from_docs(docs: list[list[dict]]) -> dict[str, np.ndarray]:
    """Flat arrays from per-document lists of choice dicts (keys as FIELDS)."""
    flat = [row for doc in docs for row in doc]
    return {name: np.array([row[name] for row in flat]) for name in FIELDS}


# ---------------------------------------------------------------------------------------------------------
# Random cases


def random_case(seed: int, max_choices: int = 5) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Rows (shuffled, padded, with gaps and non-finite values) and unconditional pairs for one seed."""
    rng = np.random.default_rng(seed)
    n_docs = int(rng.integers(1, 25))
    doc_ids = rng.choice(1_000_000, size=n_docs, replace=False)
    ll_mode = rng.choice(["int", "float", "mixed"])
    # Letter keys (MMLU style): every document's choice c shares unconditional id c.
    letter_ll = {c: float(-rng.integers(0, 6)) for c in range(5)}
    uncond: dict[int, float] = {}
    next_uid = 100
    rows: list[dict] = []
    for doc_id in doc_ids.tolist():
        k = int(rng.integers(2, max_choices + 1))
        gold = {int(rng.integers(0, k))}
        if rng.random() < 0.25:
            gold |= set(rng.choice(k, size=int(rng.integers(1, k + 1)), replace=True).tolist())
        same_len = rng.random() < 0.3  # equal lengths make normalized ties more likely
        length = int(rng.integers(1, 7))
        letters = rng.random() < 0.4
        doc_rows = []
        for c in range(k):
            n = length if same_len else int(rng.integers(1, 7))
            text = "".join(rng.choice(ALPHABET, size=n).tolist())
            n_tokens = int(rng.integers(1, 5))
            mode = ll_mode if ll_mode != "mixed" else rng.choice(["int", "float", "per_char"])
            if mode == "int":
                ll = float(-rng.integers(0, 8))
            elif mode == "per_char":  # ll proportional to length: exact ties in acc_norm
                ll = -float(rng.integers(1, 3)) * len(text)
            else:
                ll = float(-rng.exponential(4.0))
            if letters:
                uid = c
                uncond[uid] = letter_ll[c]
            else:
                uid = next_uid
                next_uid += 1
                uncond[uid] = (
                    float(-rng.integers(0, 6)) if rng.random() < 0.5 else float(-rng.exponential(3.0))
                )
            doc_rows.append(
                dict(
                    doc_id=doc_id,
                    cont_id=c,
                    n_choices=k,
                    is_gold=c in gold,
                    ll=ll,
                    uncond_id=uid,
                    n_tokens=n_tokens,
                    n_chars=len(text),
                    n_bytes=len(text.encode("utf-8")),
                    is_greedy=bool(rng.random() < 0.4),
                )
            )
        # Corruptions.
        u = rng.random()
        if u < 0.08:
            doc_rows.pop()  # the last choice: only n_choices says it is missing
        elif u < 0.14:
            doc_rows.pop(int(rng.integers(0, k)))
        if rng.random() < 0.1:
            doc_rows[int(rng.integers(0, len(doc_rows)))]["ll"] = float(rng.choice([np.nan, np.inf, -np.inf]))
        if rng.random() < 0.06:
            doc_rows[int(rng.integers(0, len(doc_rows)))]["uncond_id"] = -1
        if rng.random() < 0.04:
            doc_rows[int(rng.integers(0, len(doc_rows)))]["uncond_id"] = 5_000 + next_uid  # never scored
            next_uid += 1
        rows.extend(doc_rows)
    # A non-finite unconditional score now and then (not for the shared letter ids every time).
    for uid in list(uncond):
        if rng.random() < 0.03:
            uncond[uid] = float(rng.choice([np.nan, -np.inf]))
    # Sampler padding: repeat some rows verbatim, then shuffle.
    if rows and rng.random() < 0.6:
        n_dup = int(rng.integers(1, len(rows) + 1))
        rows.extend(dict(rows[i]) for i in rng.integers(0, len(rows), size=n_dup).tolist())
    order = rng.permutation(len(rows))
    rows = [rows[i] for i in order.tolist()]
    flat = {name: np.array([row[name] for row in rows]) for name in FIELDS}
    flat["ll"] = flat["ll"].astype(np.float64)
    flat["is_gold"] = flat["is_gold"].astype(bool)
    flat["is_greedy"] = flat["is_greedy"].astype(bool)
    # Unconditional pairs, some repeated (identical values) and shuffled.
    uids = list(uncond)
    uids += [uids[i] for i in rng.integers(0, len(uids), size=int(rng.integers(0, 4))).tolist()]
    uids = [uids[i] for i in rng.permutation(len(uids)).tolist()]
    return flat, np.array(uids, dtype=np.int64), np.array([uncond[u] for u in uids], dtype=np.float64)


def random_metrics(seed: int) -> tuple[str, ...]:
    rng = np.random.default_rng(seed + 10_000)
    kind = seed % 4
    if kind == 0:
        return ALL_METRICS
    if kind == 1:  # without PMI: non-finite unconditional scores must not skip documents
        return tuple(m for m in ALL_METRICS if not needs_uncond([m]))
    chosen = [m for m in ALL_METRICS if rng.random() < 0.5] or ["acc"]
    return tuple(rng.permutation(chosen).tolist())


SEEDS = range(200)
CHUNK = 25  # seeds per test: one pytest item per seed would cost more in overhead than in checking


def seed_chunks(seeds: range) -> list[range]:
    return [seeds[i : i + CHUNK] for i in range(0, len(seeds), CHUNK)]


def check_seeds(seeds: range, check) -> None:  # noqa: ANN001
    """Run `check(seed)` for every seed, naming the seed of a failure; a draw without any scored document is
    left to the dedicated empty-case tests (`check` returns False for it)."""
    checked = 0
    for seed in seeds:
        try:
            checked += bool(check(seed))
        except AssertionError as err:
            raise AssertionError(f"seed {seed}: {err}") from err
    assert checked >= len(seeds) // 2, f"only {checked} of {len(seeds)} draws had a scored document"


@pytest.mark.parametrize("seeds", seed_chunks(SEEDS), ids=str)
def test_icl_compute_matches_reference(seeds: range) -> None:
    def check(seed: int) -> bool:
        rows, uids, ulls = random_case(seed)
        metrics = random_metrics(seed)
        expected = reference_icl(rows, uids, ulls, metrics)
        if expected["n_docs"] == 0:
            return False
        assert_matches(run_icl(rows, uids, ulls, metrics), expected)
        return True

    check_seeds(seeds, check)


def test_random_cases_exercise_every_path() -> None:
    """The generator does produce skipped, non-finite, padded and tied documents."""
    skipped = nonfinite = ties = dups = 0
    for seed in SEEDS:
        rows, uids, ulls = random_case(seed)
        out = reference_icl(rows, uids, ulls, ALL_METRICS)
        skipped += out["n_skipped_docs"] > out["n_nonfinite_docs"]
        nonfinite += out["n_nonfinite_docs"] > 0
        pairs = list(zip(rows["doc_id"].tolist(), rows["cont_id"].tolist(), strict=True))
        dups += len(set(pairs)) < len(pairs)
        by_doc: dict[int, list[float]] = {}
        for d, ll in zip(rows["doc_id"].tolist(), rows["ll"].tolist(), strict=True):
            by_doc.setdefault(d, []).append(ll)
        ties += any(max(v) == sorted(v)[-2] for v in by_doc.values() if len(v) > 1)
    assert min(skipped, nonfinite, ties, dups) >= 20, (skipped, nonfinite, ties, dups)


def test_row_order_and_padding_do_not_matter() -> None:
    def check(seed: int) -> bool:
        rows, uids, ulls = random_case(seed)
        rng = np.random.default_rng(seed + 1)
        perm = rng.permutation(len(rows["doc_id"]))
        extra = rng.integers(0, len(perm), size=len(perm))  # pad to twice the rows
        padded = {name: rows[name][np.concatenate([perm, extra])] for name in FIELDS}
        expected = reference_icl(rows, uids, ulls, ALL_METRICS)
        assert reference_icl(padded, uids, ulls, ALL_METRICS)["n_docs"] == expected["n_docs"]
        if expected["n_docs"] == 0:
            return False
        assert_matches(run_icl(padded, uids, ulls, ALL_METRICS), expected)
        return True

    check_seeds(range(0, 200, 7), check)


# ---------------------------------------------------------------------------------------------------------
# ICLMetric


def split_points(rng: np.random.Generator, n: int, parts: int) -> list[tuple[int, int]]:
    cuts = sorted(rng.integers(0, n + 1, size=parts - 1).tolist())  # empty pieces allowed
    bounds = [0, *cuts, n]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def feed(metric: ICLMetric, rows, uids, ulls, rng: np.random.Generator) -> None:  # noqa: ANN001
    """Rows and unconditional pairs in several arbitrary pieces, interleaved."""
    t = to_tensors(rows)
    row_pieces = split_points(rng, len(rows["doc_id"]), int(rng.integers(1, 6)))
    unc_pieces = split_points(rng, len(uids), int(rng.integers(1, 4)))
    u_t = torch.as_tensor(uids, dtype=torch.int64)
    l_t = torch.as_tensor(ulls, dtype=torch.float64)
    for i in range(max(len(row_pieces), len(unc_pieces))):
        if i < len(unc_pieces):
            a, b = unc_pieces[i]
            metric.update_uncond(u_t[a:b], l_t[a:b])
        if i < len(row_pieces):
            a, b = row_pieces[i]
            metric.update(**{name: t[name][a:b] for name in REQUEST_FIELDS})


@pytest.mark.parametrize("seeds", seed_chunks(range(75)), ids=str)
def test_metric_updates_in_pieces_match_reference(seeds: range) -> None:
    def check(seed: int) -> bool:
        rows, uids, ulls = random_case(seed)
        metrics = random_metrics(seed)
        expected = reference_icl(rows, uids, ulls, metrics)
        if expected["n_docs"] == 0:
            return False
        metric = ICLMetric(metrics)
        feed(metric, rows, uids, ulls, np.random.default_rng(seed + 7))
        assert_matches(metric.compute(), expected)
        return True

    check_seeds(seeds, check)


def test_metric_reset() -> None:
    """One metric object reused across evaluations: after `reset()` only the new rows count."""
    metric = ICLMetric(ALL_METRICS)

    def check(seed: int) -> bool:
        rng = np.random.default_rng(seed)
        feed(metric, *random_case(seed), rng)
        metric.compute()
        metric.reset()
        rows_b, uids_b, ulls_b = random_case(seed + 1000)
        expected_b = reference_icl(rows_b, uids_b, ulls_b, ALL_METRICS)
        feed(metric, rows_b, uids_b, ulls_b, rng)
        found = metric.compute()
        metric.reset()
        if expected_b["n_docs"] == 0:
            return False
        assert_matches(found, expected_b)
        return True

    check_seeds(range(10), check)


def test_metric_float32_ll_input() -> None:
    """Scores arriving in float32 are compared as the same float32 values widened to float64."""
    rows, uids, ulls = random_case(3)
    rows["ll"] = rows["ll"].astype(np.float32).astype(np.float64)
    ulls = ulls.astype(np.float32).astype(np.float64)
    expected = reference_icl(rows, uids, ulls, ALL_METRICS)
    assert expected["n_docs"] > 0
    t = to_tensors(rows)
    t["ll"] = t["ll"].to(torch.float32)
    metric = ICLMetric(ALL_METRICS)
    metric.update(**t)
    metric.update_uncond(torch.as_tensor(uids), torch.as_tensor(ulls, dtype=torch.float32))
    assert_matches(metric.compute(), expected)


# ---------------------------------------------------------------------------------------------------------
# Hand-worked cases (check the reference as well as the implementation)


def row(
    doc_id, cont_id, n_choices, is_gold, ll, uncond_id, n_tokens, n_chars, n_bytes, is_greedy=False
) -> dict:  # noqa: ANN001
    return dict(
        doc_id=doc_id,
        cont_id=cont_id,
        n_choices=n_choices,
        is_gold=is_gold,
        ll=float(ll),
        uncond_id=uncond_id,
        n_tokens=n_tokens,
        n_chars=n_chars,
        n_bytes=n_bytes,
        is_greedy=is_greedy,
    )


def two_doc_example() -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    # Doc 7: 2 choices, gold 1.          ll = [-2, -3], ll_uncond = [-1, -5]
    #   acc:           [-2, -3]                  -> 0, wrong
    #   acc_norm:      chars [1, 6]: [-2, -0.5]  -> 1, right
    #   acc_bytes:     bytes [4, 6]: [-0.5, -0.5] tie -> 0, wrong
    #   acc_per_token: tokens [1, 2]: [-2, -1.5] -> 1, right
    #   acc_pmi:       [-2+1, -3+5] = [-1, 2]    -> 1, right
    #   ce_gold = 3/2, bpb_gold = 3/6/ln2 = 0.5/ln2
    #   p = softmax([-2, -3]) = [e/(1+e), 1/(1+e)]; prob_gold = 1/(1+e); brier = 2 (e/(1+e))^2
    # Doc 3: 3 choices, golds {0, 2}.    ll = [-1, -1, -4], lengths all 1, ll_uncond = [0, -3, 0]
    #   acc, acc_norm, acc_bytes, acc_per_token: tie of 0 and 1 -> 0, right
    #   acc_pmi: [-1, 2, -4] -> 1, wrong
    #   g = 0: ce_gold = 1, bpb_gold = 1/ln2
    #   p = [1, 1, e^-3] / (2 + e^-3); prob_gold = (1 + e^-3)/(2 + e^-3); brier = (1 - prob_gold)^2 + p_1^2
    #        = 2 / (2 + e^-3)^2
    # Unconditional ids 12 (value 0) is shared by doc 3's choices 0 and 2.
    # Prediction figures (labels = first golds [1, 0], predictions argmax ll [0, 0], 3 classes: macro):
    #   f1: class 0 tp 1 fp 1 fn 0 -> 2/3; class 1 tp 0 fn 1 -> 0; class 2 -> 0; mean 2/9
    #   ece: confidences e/(1+e) = 0.73 (bin (0.7, 0.8], wrong), 1/(2+e^-3) = 0.49 (bin (0.4, 0.5], right):
    #        (|0 - e/(1+e)| + |1 - 1/(2+e^-3)|) / 2
    #   acc_greedy: doc 7's gold is greedy, doc 3's golds are not -> 0.5; ppl_gold = exp((3 + 1) / 2)
    docs = [
        [row(7, 0, 2, False, -2, 10, 1, 1, 4), row(7, 1, 2, True, -3, 11, 2, 6, 6, is_greedy=True)],
        [
            row(3, 0, 3, True, -1, 12, 1, 1, 1),
            row(3, 1, 3, False, -1, 13, 1, 1, 1, is_greedy=True),
            row(3, 2, 3, True, -4, 12, 1, 1, 1),
        ],
    ]
    uids = np.array([10, 11, 12, 13])
    ulls = np.array([-1.0, -5.0, 0.0, -3.0])
    return rows_from_docs(docs), uids, ulls


def two_doc_expected() -> dict[str, float]:
    e = math.e
    e3 = math.exp(-3)
    half_se = math.sqrt(0.5) / math.sqrt(2)  # x = [0, 1]: sqrt(0.5 / 1) / sqrt(2) = 0.5
    return {
        "n_docs": 2.0,
        "n_skipped_docs": 0.0,
        "n_nonfinite_docs": 0.0,
        "acc": 0.5,
        "acc_stderr": half_se,
        "acc_norm": 1.0,
        "acc_norm_stderr": 0.0,
        "acc_bytes": 0.5,
        "acc_bytes_stderr": half_se,
        "acc_per_token": 1.0,
        "acc_per_token_stderr": 0.0,
        "acc_pmi": 0.5,
        "acc_pmi_stderr": half_se,
        "ce_gold": (1.5 + 1.0) / 2,
        "bpb_gold": (0.5 + 1.0) / 2 / LN2,
        "prob_gold": (1 / (1 + e) + (1 + e3) / (2 + e3)) / 2,
        "brier": (2 * (e / (1 + e)) ** 2 + 2 / (2 + e3) ** 2) / 2,
        "ppl_gold": math.exp(2.0),
        "f1": 2 / 9,
        "ece": (e / (1 + e) + 1 - 1 / (2 + e3)) / 2,
        "acc_greedy": 0.5,
        "acc_greedy_stderr": half_se,
        "acc_mutual_info": 0.5,
        "acc_mutual_info_stderr": half_se,
        "brier_score": (2 * (e / (1 + e)) ** 2 + 2 / (2 + e3) ** 2) / 2,
    }


def test_hand_example_reference() -> None:
    rows, uids, ulls = two_doc_example()
    assert_matches(reference_icl(rows, uids, ulls, ALL_METRICS), two_doc_expected())
    assert two_doc_expected()["acc_stderr"] == pytest.approx(0.5)


def test_hand_example_icl_compute() -> None:
    rows, uids, ulls = two_doc_example()
    assert_matches(run_icl(rows, uids, ulls, ALL_METRICS), two_doc_expected())


def test_hand_example_metric() -> None:
    rows, uids, ulls = two_doc_example()
    metric = ICLMetric(ALL_METRICS)
    feed(metric, rows, uids, ulls, np.random.default_rng(0))
    assert_matches(metric.compute(), two_doc_expected())


def test_mean_stderr_by_hand() -> None:
    # x = [1, 0, 1, 1]: mean 0.75, squares 3 * 0.0625 + 0.5625 = 0.75, / 3 = 0.25, sqrt 0.5, / sqrt(4) = 0.25
    assert mean_stderr([1.0, 0.0, 1.0, 1.0]) == pytest.approx(0.25, abs=1e-15)
    assert mean_stderr([1.0]) == 0.0
    assert mean_stderr([]) == 0.0


def counting_example() -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    # doc 0: complete and finite                         -> scored (acc right: ll [-1, -2], gold 0)
    # doc 1: 3 choices, the LAST (cont_id 2) missing     -> skipped, not non-finite
    # doc 2: 3 choices, the middle one missing           -> skipped, not non-finite
    # doc 3: complete, one ll NaN                        -> skipped and non-finite
    # doc 4: complete, one ll -inf                       -> skipped and non-finite
    # doc 5: missing a choice AND a NaN                  -> skipped, not non-finite (it never had all rows)
    # doc 6: complete, finite ll, uncond_id -1           -> non-finite only when acc_pmi is requested
    # doc 7: complete, finite ll, uncond id never scored -> same as doc 6 (acc wrong: ll [-3, -1], gold 0)
    # doc 8: complete, uncond score +inf                 -> same as doc 6 (acc right)
    # doc 0 is padded twice (duplicated rows count once).
    docs = [
        [row(0, 0, 2, True, -1, 50, 1, 1, 1), row(0, 1, 2, False, -2, 51, 1, 1, 1)] * 3,
        [row(1, 0, 3, True, -1, 50, 1, 1, 1), row(1, 1, 3, False, -2, 51, 1, 1, 1)],
        [row(2, 0, 3, True, -1, 50, 1, 1, 1), row(2, 2, 3, False, -2, 51, 1, 1, 1)],
        [row(3, 0, 2, True, math.nan, 50, 1, 1, 1), row(3, 1, 2, False, -2, 51, 1, 1, 1)],
        [row(4, 0, 2, True, -1, 50, 1, 1, 1), row(4, 1, 2, False, -math.inf, 51, 1, 1, 1)],
        [row(5, 0, 3, True, math.nan, 50, 1, 1, 1), row(5, 1, 3, False, -2, 51, 1, 1, 1)],
        [row(6, 0, 2, True, -1, -1, 1, 1, 1), row(6, 1, 2, False, -2, 51, 1, 1, 1)],
        [row(7, 0, 2, True, -3, 50, 1, 1, 1), row(7, 1, 2, False, -1, 99, 1, 1, 1)],
        [row(8, 0, 2, True, -1, 50, 1, 1, 1), row(8, 1, 2, False, -2, 52, 1, 1, 1)],
    ]
    uids = np.array([50, 51, 52, 50])  # 50 reported twice (identical), 99 never
    ulls = np.array([-1.0, -1.5, math.inf, -1.0])
    return rows_from_docs(docs), uids, ulls


def test_counting_with_pmi() -> None:
    rows, uids, ulls = counting_example()
    # Only doc 0 is scored; docs 3, 4, 6, 7, 8 are non-finite; docs 1, 2, 5 incomplete.
    want = {"n_docs": 1.0, "n_skipped_docs": 8.0, "n_nonfinite_docs": 5.0, "acc": 1.0, "acc_stderr": 0.0}
    want |= {"acc_pmi": 1.0, "acc_pmi_stderr": 0.0}  # doc 0: [-1 + 1, -2 + 1.5] = [0, -0.5] -> 0
    metrics = ("acc", "acc_pmi")
    assert_matches(reference_icl(rows, uids, ulls, metrics), want)
    assert_matches(run_icl(rows, uids, ulls, metrics), want)


def test_counting_without_pmi() -> None:
    rows, uids, ulls = counting_example()
    # Docs 0, 6, 7, 8 scored: acc right, right, wrong, right -> 0.75; se 0.25 (see test_mean_stderr_by_hand).
    want = {"n_docs": 4.0, "n_skipped_docs": 5.0, "n_nonfinite_docs": 2.0, "acc": 0.75, "acc_stderr": 0.25}
    assert_matches(reference_icl(rows, uids, ulls, ("acc",)), want)
    assert_matches(run_icl(rows, uids, ulls, ("acc",)), want)


def test_missing_last_choice_only() -> None:
    """n_choices is the only evidence that the last choice is missing."""
    docs = [[row(0, c, 4, c == 0, -1.0 - c, 5, 1, 1, 1) for c in range(3)]]
    rows = rows_from_docs(docs)
    for found in (reference_icl(rows, [5], [0.0], ("acc",)), run_icl(rows, [5], [0.0], ("acc",))):
        assert found["n_docs"] == 0.0
        assert found["n_skipped_docs"] == 1.0
        assert found["n_nonfinite_docs"] == 0.0


def test_several_golds_brier_and_prob() -> None:
    # ll = [0, 0, ln 2, 0] -> p = [1, 1, 2, 1] / 5; golds {1, 2}: prob_gold = 3/5,
    # brier = (1 - 3/5)^2 + (1/5)^2 + (1/5)^2 = 4/25 + 2/25 = 6/25; argmax 2 (in golds) -> acc 1.
    # g = 1 (lowest gold): ce_gold = 0 / 3 = 0, bpb_gold = 0.
    ll = [0.0, 0.0, math.log(2), 0.0]
    docs = [[row(0, c, 4, c in (1, 2), ll[c], -1, 3, 2, 2) for c in range(4)]]
    rows = rows_from_docs(docs)
    metrics = ("acc", "prob_gold", "brier", "ce_gold", "bpb_gold")
    want = {"n_docs": 1.0, "n_skipped_docs": 0.0, "n_nonfinite_docs": 0.0, "acc": 1.0, "acc_stderr": 0.0}
    want |= {"prob_gold": 0.6, "brier": 6 / 25, "ce_gold": 0.0, "bpb_gold": 0.0}
    assert_matches(reference_icl(rows, np.zeros(0), np.zeros(0), metrics), want)
    assert_matches(run_icl(rows, np.zeros(0, dtype=np.int64), np.zeros(0), metrics), want)


def test_ties_go_to_lowest_index() -> None:
    # Every score ties in every variant (equal ll, lengths and uncond): the argmax is choice 0.
    docs = [[row(d, c, 3, c == d, -2.0, 1, 2, 3, 5) for c in range(3)] for d in range(3)]
    rows = rows_from_docs(docs)
    metrics = ACCURACIES
    for found in (reference_icl(rows, [1], [-1.0], metrics), run_icl(rows, [1], [-1.0], metrics)):
        for name in ACCURACIES:
            assert found[name] == 1 / 3, (name, found[name])


def test_only_requested_keys() -> None:
    rows, uids, ulls = two_doc_example()
    found = run_icl(rows, uids, ulls, ("brier", "acc_norm"))
    assert set(found) == {*COUNTS, "brier", "acc_norm", "acc_norm_stderr"}


def test_no_scored_document() -> None:
    """All documents incomplete: counts are right, means NaN, and `_stderr` 0.0 (the spec: 0.0 when n < 2)."""
    docs = [[row(0, 0, 2, True, -1.0, -1, 1, 1, 1)], [row(1, 1, 3, True, -1.0, -1, 1, 1, 1)]]
    rows = rows_from_docs(docs)
    found = run_icl(rows, np.zeros(0, dtype=np.int64), np.zeros(0), ALL_METRICS)
    assert found["n_docs"] == 0.0
    assert found["n_skipped_docs"] == 2.0
    assert found["n_nonfinite_docs"] == 0.0
    assert_matches(found, reference_icl(rows, np.zeros(0), np.zeros(0), ALL_METRICS))


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric ICLMetric was called before")
def test_empty_metric() -> None:
    """A metric that saw nothing (a rank with no share of the documents) computes without error."""
    found = ICLMetric(ALL_METRICS).compute()
    assert_matches(found, reference_icl({name: np.zeros(0) for name in FIELDS}, [], [], ALL_METRICS))


def test_large_sparse_ids() -> None:
    """Document and unconditional ids are arbitrary non-negative integers (e.g. hashes), not dense indices;
    memory must not grow with the largest id."""
    base = 2**40
    docs = [
        [row(base + 3 * d, c, 2, c == d % 2, -1.0 - c, base + 7 * c, 1, 1, 1) for c in range(2)]
        for d in range(3)
    ]
    rows = rows_from_docs(docs)
    uids, ulls = np.array([base, base + 7]), np.array([-1.0, -2.5])
    expected = reference_icl(rows, uids, ulls, ALL_METRICS)
    assert expected["n_docs"] == 3.0
    assert_matches(run_icl(rows, uids, ulls, ALL_METRICS), expected)


# ---------------------------------------------------------------------------------------------------------
# F1, calibration, greedy exact match, harness names


@pytest.mark.parametrize("seeds", seed_chunks(range(100)), ids=str)
def test_two_choice_tasks_match_reference(seeds: range) -> None:
    """Binary F1 (of choice 1) on two-choice documents only, as RTE, MRPC, SST-2."""

    def check(seed: int) -> bool:
        rows, uids, ulls = random_case(seed, max_choices=2)
        metrics = ("acc", "f1", "ece", "acc_greedy", "ppl_gold")
        expected = reference_icl(rows, uids, ulls, metrics)
        if expected["n_docs"] == 0:
            return False
        assert_matches(run_icl(rows, uids, ulls, metrics), expected)
        return True

    check_seeds(seeds, check)


def test_f1_by_hand() -> None:
    # Binary: labels [1, 1, 0, 0, 1], preds [1, 0, 0, 1, 1]: class 1 tp 2 fp 1 fn 1 -> 4 / 6.
    assert f1_score([1, 1, 0, 0, 1], [1, 0, 0, 1, 1], 2) == pytest.approx(2 / 3)
    # Three classes, labels [0, 1, 2, 2], preds [0, 2, 2, 1]: F1 1, 0, 2/4 -> macro 1/2.
    assert f1_score([0, 1, 2, 2], [0, 2, 2, 1], 3) == pytest.approx(0.5)
    ll = {1: [-1.0, -2.0], 2: [-2.0, -1.0], 3: [-1.0, -3.0], 4: [-3.0, -1.0], 5: [-5.0, -1.0]}
    labels = {1: 1, 2: 1, 3: 0, 4: 0, 5: 1}  # predictions [0, 1, 0, 1, 1]: class 1 tp 2 fp 1 fn 1
    docs = [[row(d, c, 2, c == labels[d], ll[d][c], -1, 1, 1, 1) for c in range(2)] for d in ll]
    rows = rows_from_docs(docs)
    found = run_icl(rows, np.zeros(0, dtype=np.int64), np.zeros(0), ("f1",))
    assert found["f1"] == pytest.approx(2 / 3)
    assert_matches(found, reference_icl(rows, np.zeros(0), np.zeros(0), ("f1",)))


def test_ece_by_hand() -> None:
    # Confidences 0.5 (tie of two, bin (0.4, 0.5]), 0.5, 0.9; correct 1, 0, 1:
    # bin (0.4, 0.5]: 2/3 |0.5 - 0.5| = 0; bin (0.8, 0.9]: 1/3 |1 - 0.9| = 1/30.
    assert expected_calibration_error([0.5, 0.5, 0.9], [1.0, 0.0, 1.0]) == pytest.approx(1 / 30)
    nine = math.log(9.0)  # softmax([ln 9, 0]) = [0.9, 0.1]
    docs = [
        [row(0, 0, 2, True, -1.0, -1, 1, 1, 1), row(0, 1, 2, False, -1.0, -1, 1, 1, 1)],
        [row(1, 0, 2, False, -1.0, -1, 1, 1, 1), row(1, 1, 2, True, -1.0, -1, 1, 1, 1)],
        [row(2, 0, 2, True, nine, -1, 1, 1, 1), row(2, 1, 2, False, 0.0, -1, 1, 1, 1)],
    ]
    rows = rows_from_docs(docs)
    found = run_icl(rows, np.zeros(0, dtype=np.int64), np.zeros(0), ("ece", "acc"))
    assert found["ece"] == pytest.approx(1 / 30) and found["acc"] == pytest.approx(2 / 3)
    assert_matches(found, reference_icl(rows, np.zeros(0), np.zeros(0), ("ece", "acc")))


def test_greedy_exact_match_and_word_perplexity() -> None:
    """LAMBADA: one continuation per document; acc_greedy is its greedy flag, ppl_gold exp(mean -ll)."""
    lls, greedy = [-1.0, -2.0, -6.0], [True, True, False]
    docs = [[row(d, 0, 1, True, lls[d], -1, 2, 5, 5, is_greedy=greedy[d])] for d in range(3)]
    rows = rows_from_docs(docs)
    metrics = ("acc_greedy", "ppl_gold", "ce_gold", "bpb_gold")
    found = run_icl(rows, np.zeros(0, dtype=np.int64), np.zeros(0), metrics)
    assert found["acc_greedy"] == pytest.approx(2 / 3)
    assert found["ppl_gold"] == pytest.approx(math.exp(3.0))
    assert found["ce_gold"] == pytest.approx(9.0 / 3 / 2)
    assert_matches(found, reference_icl(rows, np.zeros(0), np.zeros(0), metrics))


def test_harness_names_are_the_same_figures() -> None:
    rows, uids, ulls = two_doc_example()
    found = run_icl(rows, uids, ulls, ("acc_mutual_info", "brier_score"))
    ours = run_icl(rows, uids, ulls, ("acc_pmi", "brier"))
    assert found["acc_mutual_info"] == ours["acc_pmi"] and found["brier_score"] == ours["brier"]
    assert "acc_pmi" not in found and "brier" not in found
    assert (
        needs_uncond(["acc_mutual_info"]) and needs_uncond(["acc_pmi"]) and not needs_uncond(["acc", "brier"])
    )
    with pytest.raises(ValueError, match="unknown metrics \\['mcc'\\]"):
        run_icl(rows, uids, ulls, ("acc", "mcc"))


def test_every_default_figure_of_a_format_is_defined():
    """formats.py names figures without loading torch; each name is one registry.py computes, each OLMo
    metric type one olmo.py computes."""
    for figures in (*METRICS_BY_FORMAT.values(), GREEDY_METRICS, LENGTH_NORM_METRICS):
        assert set(figures) <= set(METRICS)
    for metric_type in OLMO_METRIC_TYPES:
        assert olmo_figures(metric_type)
