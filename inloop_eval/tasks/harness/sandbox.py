"""The bounded Jinja sandbox harness templates render in (`doc_to_text`, `doc_to_choice`, `doc_to_target`,
`description`).

Jinja's sandbox bounds attribute access, not work; `BoundedSandbox` also bounds the work of each rendering, so
a YAML file cannot ask for a huge power, a huge repetition or an endless loop.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from jinja2 import BaseLoader, StrictUndefined, Template
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context
from jinja2.sandbox import SandboxedEnvironment

# What one rendering may do. The sandbox bounds attribute access, not work: these bound the work a YAML
# file can ask for (a power with a huge result, a huge repetition, endless loops over `range`).
MAX_TEMPLATE_OPS = 1_000_000  # calls, attribute and item lookups, operators and range items per rendering
MAX_POWER_BITS = 4096  # `a ** b` on integers: refused when the result would need more bits
MAX_REPEAT_LENGTH = 1_000_000  # `s * n` on a string or list: refused when the result would be longer


class TemplateBudgetError(SecurityError):
    """A template asked for more work than one rendering may do."""


class BoundedSandbox(SandboxedEnvironment):
    """Jinja's sandbox with the work of each rendering bounded: every call, lookup, `**`, `*` and range
    item counts against `MAX_TEMPLATE_OPS`, and powers and repetitions with huge results are refused
    before they are computed. (A loop whose body does none of these counts only through its iterable.)"""

    intercepted_binops = frozenset({"**", "*"})

    def __init__(self) -> None:
        super().__init__(loader=BaseLoader(), undefined=StrictUndefined, keep_trailing_newline=True)
        self.ops_left = MAX_TEMPLATE_OPS
        self.compiled: dict[str, Template] = {}
        self.globals["range"] = self.bounded_range
        self.filters["regex_replace"] = lambda s, pattern, repl, count=0: re.sub(
            pattern, repl, s, count=count
        )

    def render(self, template: str, doc: Mapping[str, Any]) -> str:
        """`template` rendered with the fields of `doc`, within a fresh budget."""
        self.ops_left = MAX_TEMPLATE_OPS
        if template not in self.compiled:  # operators are intercepted, so compiling folds no constant
            self.compiled[template] = self.from_string(template)
        return self.compiled[template].render(**doc)

    def spend(self, n: int = 1) -> None:
        self.ops_left -= n
        if self.ops_left < 0:
            raise TemplateBudgetError(
                f"the template does more than {MAX_TEMPLATE_OPS} operations in one rendering"
            )

    def bounded_range(self, *args: int) -> range:
        items = range(*args)
        self.spend(len(items))
        return items

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        self.spend()
        if operator == "**" and _int(left) and _int(right) and right > 0 and abs(left) > 1:
            bits = math.inf if right.bit_length() > 256 else right * math.log2(abs(left))
            if bits > MAX_POWER_BITS:
                raise TemplateBudgetError(
                    f"{left} ** {right} would have about {bits:.3g} bits; at most {MAX_POWER_BITS} are allowed"
                )
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and _int(n) and len(seq) * n > MAX_REPEAT_LENGTH:
                    raise TemplateBudgetError(
                        f"repeating a {type(seq).__name__} of length {len(seq)} {n} times is longer than "
                        f"{MAX_REPEAT_LENGTH}"
                    )
        return super().call_binop(context, operator, left, right)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.spend()
        return super().call(context, obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:
        self.spend()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.spend()
        return super().getitem(obj, argument)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_ENV: BoundedSandbox | None = None


def render_template(template: str, doc: Mapping[str, Any]) -> str:
    """A harness template rendered in the bounded sandbox (one environment per process, each template
    compiled once)."""
    global _ENV
    if _ENV is None:
        _ENV = BoundedSandbox()
    return _ENV.render(template, doc)
