"""`inloop-eval compare`'s table: a 95% interval that tells another story than the verdict beside it (the
normal interval against Student's t on few documents) is marked and explained, never left bare."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from inloop_eval.compare.command import interval_disagrees, render_table, result_json
from inloop_eval.compare.pairing import Comparison, TaskComparison
from inloop_eval.metrics.paired import CANNOT_TELL, paired_difference


def result_with_t(t: float, n: int = 10):
    """A continuous figure's paired result whose t statistic is `t` on `n` documents."""
    d_N = np.array([1.0, -1.0] * (n // 2)) + 0.0
    d_N = d_N / (d_N.std(ddof=1) / np.sqrt(n))  # a standard error of 1
    d_N += t - d_N.mean()
    return paired_difference(np.zeros(n), d_N, binary=False)


def table(result) -> str:
    side = SimpleNamespace(source="run", step=50)
    task = TaskComparison("arc_easy", result.n, 0, 0, {"ce_gold": result})
    return render_table(Comparison(side, side, {"arc_easy": task}, [], []))


def test_an_interval_excluding_zero_beside_cannot_tell_is_marked_and_explained():
    r = result_with_t(2.1)  # past 1.96, short of t(9)'s 2.262
    assert r.verdict == CANNOT_TELL and r.ci95[0] > 0 and r.p_value > 0.05
    text = table(r)
    assert interval_disagrees(r) and result_json(r)["ci95_disagrees_with_verdict"]
    assert "] *" in text
    assert "*: the interval and the verdict disagree" in text and "normal approximation" in text


def test_an_interval_agreeing_with_its_verdict_is_not_marked():
    for t in (1.0, 3.0):
        r = result_with_t(t)
        text = table(r)
        assert not interval_disagrees(r) and "] *" not in text and "*: the interval" not in text
