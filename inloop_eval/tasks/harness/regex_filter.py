"""The `regex_replace` filter of harness templates, with its running time bounded before it starts.

Python's `re` cannot be interrupted and backtracks: a repeat inside a repeat (`(a+)+$`) takes time exponential
in its input, and k variable-length repeats in a row up to about n^(k+1) steps for `re.sub` on n characters.
So a pattern that nests a repeat (or an alternation, or a back-reference) inside a repeat is refused, and the
input may be at most `MAX_REGEX_STEPS ** (1 / (k + 1))` characters, k counting the pattern's variable-length
repeats and back-references: with 10**8 steps (about a second), 10,000 characters for one repeat (`\\s+`),
464 for two, 100 for three; up to `MAX_VALUE_SIZE` for none. Each match counts as one template operation.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from inloop_eval.tasks.harness.bounds import MAX_VALUE_SIZE, TemplateBudgetError

try:
    from re import _parser as sre_parse  # Python 3.11+
except ImportError:  # Python 3.10
    import sre_parse  # type: ignore[no-redef]

MAX_REGEX_STEPS = 10**8  # worst-case backtracking steps allowed to one regex_replace call
MAX_REGEX_PATTERN = 200  # characters of a pattern

_REPEATS = frozenset({"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"})


@functools.lru_cache(maxsize=256)
def input_limit(pattern: str) -> int:
    """How many characters `pattern` may scan within `MAX_REGEX_STEPS`; raises for a pattern whose time can
    grow exponentially."""
    if len(pattern) > MAX_REGEX_PATTERN:
        raise TemplateBudgetError(
            f"regex_replace pattern of {len(pattern)} characters; at most {MAX_REGEX_PATTERN} are allowed"
        )
    repeats, _ = _scan(pattern, sre_parse.parse(pattern))
    return min(MAX_VALUE_SIZE, int(MAX_REGEX_STEPS ** (1 / (repeats + 1))))


def _scan(pattern: str, subpattern: Any) -> tuple[int, bool]:
    """(variable-length repeats and back-references, whether some part can match in several ways)."""
    repeats, ambiguous = 0, False
    for op, arg in subpattern:
        name = str(op)
        parts: list[Any] = []
        if name in _REPEATS:
            low, high, body = arg
            inner, inner_ambiguous = _scan(pattern, body)
            if high > 1 and (inner or inner_ambiguous):
                raise TemplateBudgetError(
                    f"regex_replace pattern {pattern!r} repeats a part that itself repeats, alternates or "
                    "refers back, which can take time exponential in the input; write it without nesting "
                    "(e.g. `(a+)+` as `a+`, `(?:ab|cd)+` as `(?:[ac][bd])+` where that is meant)"
                )
            repeats += inner + (low != high)
            ambiguous = ambiguous or inner_ambiguous or low != high
        elif name == "BRANCH":
            parts, ambiguous = arg[1], True
        elif name == "GROUPREF_EXISTS":
            parts, ambiguous = [p for p in arg[1:] if p is not None], True
        elif name == "GROUPREF":
            repeats, ambiguous = repeats + 1, True
        elif name == "SUBPATTERN":
            parts = [arg[3]]
        elif name in ("ASSERT", "ASSERT_NOT"):
            parts = [arg[1]]
        elif name == "ATOMIC_GROUP":
            parts = [arg]
        for part in parts:
            inner, inner_ambiguous = _scan(pattern, part)
            repeats, ambiguous = repeats + inner, ambiguous or inner_ambiguous
    return repeats, ambiguous


def bounded_regex_replace(spend: Callable[[int], None]) -> Callable[..., str]:
    """The `regex_replace(pattern, repl, count=0)` filter of lm-evaluation-harness (`re.sub`), bounded as the
    module docstring says; `spend(n)` charges the template's budget (one operation a match)."""

    def regex_replace(text: Any, pattern: Any, repl: Any, count: int = 0) -> str:
        if not isinstance(pattern, str) or not isinstance(repl, str):
            raise TypeError(
                f"regex_replace: expected a string pattern and replacement, found {type(pattern).__name__} "
                f"and {type(repl).__name__}"
            )
        limit = input_limit(pattern)
        if isinstance(text, str) and len(text) > limit:
            raise TemplateBudgetError(
                f"regex_replace pattern {pattern!r} on {len(text)} characters: with its repeats it may "
                f"scan at most {limit} (up to {MAX_REGEX_STEPS:.0e} backtracking steps)"
            )
        room = MAX_VALUE_SIZE - (len(text) if isinstance(text, str) else 0)
        literal = "\\" not in repl

        def replacement(match: re.Match[str]) -> str:
            nonlocal room
            spend(1)
            out = repl if literal else match.expand(repl)
            room -= len(out)
            if room < 0:
                raise TemplateBudgetError(
                    f"regex_replace pattern {pattern!r} would build more than {MAX_VALUE_SIZE} characters"
                )
            return out

        return re.sub(pattern, replacement, text, count=count)

    return regex_replace
