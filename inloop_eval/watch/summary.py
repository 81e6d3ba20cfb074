"""What the watcher tells its user in a line: a step's headline figures, and what a run did (evaluated,
found done before, failed)."""

from __future__ import annotations

from collections.abc import Mapping

from inloop_eval.keys import DOWNSTREAM, FAILED, PERPLEXITY, PREFIX, SECONDS_KEY, SUITE, split_key
from inloop_eval.loggers.summary import number

# Each label's figure shown in its headline, the first of these it has.
HEADLINE_FIGURES = ("acc", "acc_greedy", "ppl", "centered_acc", "bpb")
SHOWN_LABELS = 8


def headline(metrics: Mapping[str, float], prefix: str = PREFIX) -> str:
    """`piqa acc 0.6000, c4 ppl 1,869, ...`: one figure per task, domain and suite (FAILED for a failed
    one)."""
    figures: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        for kind in (DOWNSTREAM, PERPLEXITY, SUITE):
            parts = split_key(key, kind, prefix)
            if parts is not None:
                figures.setdefault(parts[0], {})[parts[1]] = value
                break
    shown = []
    for label, by_figure in figures.items():
        if by_figure.get(FAILED):
            shown.append(f"{label} FAILED")
            continue
        figure = next((f for f in HEADLINE_FIGURES if f in by_figure), None)
        if figure is not None:
            shown.append(f"{label} {figure} {number(by_figure[figure], figure)}")
    more = f", ... ({len(shown) - SHOWN_LABELS} more)" if len(shown) > SHOWN_LABELS else ""
    seconds = metrics.get(SECONDS_KEY)
    took = f" ({seconds:.1f} s)" if isinstance(seconds, float) else ""
    return (", ".join(shown[:SHOWN_LABELS]) + more or "no figures") + took


def steps_text(steps: list[int]) -> str:
    return ("step " if len(steps) == 1 else "steps ") + ", ".join(str(s) for s in steps)


def closing_line(evaluated: list[int], before: dict[str, list[int]], failed: dict[int, str]) -> str:
    """The line `inloop-eval watch` ends with. before: why -> the steps found done before this run, e.g.
    `in metrics.jsonl` -> [10, 20]; failed: step -> why, for the steps that failed in this run."""
    if evaluated:
        plural = "s" if len(evaluated) != 1 else ""
        text = f"watch: evaluated {len(evaluated)} checkpoint{plural}: {steps_text(evaluated)}"
    else:
        text = "watch: nothing new"
    done = [f"{steps_text(steps)} already {why}" for why, steps in before.items() if steps]
    if done:
        text += ("; " if evaluated else ": ") + "; ".join(done)
    for step, why in sorted(failed.items()):
        text += f"; step {step} failed: {why}"
    return text
