"""The bounded Jinja sandbox harness templates render in (`doc_to_text`, `doc_to_choice`, `doc_to_target`,
`description`).

Jinja's sandbox bounds attribute access, not work. `BoundedSandbox` bounds the work of each rendering, so that a
hostile or mistaken YAML file fails its task within seconds instead of hanging or exhausting the process:

- a budget of `MAX_TEMPLATE_OPS` operations: each call, filter, lookup, operator, literal, concatenation,
  loop step, `range` item and regex match costs one, and each value an operation takes or builds costs one
  more per container item and per `CHARS_PER_OP` characters, so the budget counts work, not only steps;
- sizes (`bounds`): no value built or handled, and no output, over `MAX_VALUE_SIZE`; integers under
  `MAX_INT_BITS`; widths, repeats, separators and replacements checked before they allocate;
- `regex_replace` with its pattern and input bounded (`regex_filter`);
- a wall-clock deadline of `MAX_RENDER_SECONDS`, checked at every counted operation, for whatever work the
  counts above undervalue;
- `lipsum` and the filters `urlize`, `pprint` and `striptags` (no use in a prompt, costs hard to bound) removed;
  templates compile without Jinja's folding pass, and the constants Jinja still folds go through the same
  bounded filters, charged to the first rendering.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Mapping, Sized
from typing import Any

from jinja2 import BaseLoader, StrictUndefined, Template, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.runtime import Context, LoopContext
from jinja2.sandbox import SandboxedEnvironment

from inloop_eval.tasks.harness.bounds import (
    ESTIMATED_FILTERS,
    MAX_VALUE_SIZE,
    TemplateBudgetError,
    check_filter,
    check_int_product,
    check_method,
    check_power,
    check_printf,
    check_repeat,
    refuse_size,
    weigh,
)
from inloop_eval.tasks.harness.regex_filter import bounded_regex_replace

MAX_TEMPLATE_OPS = 1_000_000  # operations per rendering (see the module docstring for what counts)
CHARS_PER_OP = 10  # characters of a value an operation takes or builds that cost one more operation
MAX_RENDER_SECONDS = 2.0  # wall-clock time of one rendering

REMOVED_FILTERS = ("urlize", "pprint", "striptags")
REMOVED_GLOBALS = ("lipsum",)


class BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator with loop iterables, `~` concatenations and list, tuple and dict literals routed
    through the environment, where their work is counted (Jinja compiles them to plain Python)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loop_iterables: set[int] = set()  # ids of the `{% for %}` iterables being compiled

    def visit(self, node: nodes.Node, *args: Any, **kwargs: Any) -> Any:
        if id(node) not in self.loop_iterables:
            return super().visit(node, *args, **kwargs)
        self.write("environment.counted_iter(")
        super().visit(node, *args, **kwargs)
        self.write(")")
        return None

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        self.loop_iterables.add(id(node.iter))
        super().visit_For(node, frame)

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.bounded_concat((")
        for part in node.nodes:
            self.visit(part, frame)
            self.write(", ")
        self.write("))")

    def visit_List(self, node: nodes.List, frame: Frame) -> None:
        self.write("environment.built(")
        super().visit_List(node, frame)
        self.write(")")

    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:
        if node.ctx != "load":  # an assignment target (`{% for a, b in ... %}`), not a value
            super().visit_Tuple(node, frame)
            return
        self.write("environment.built(")
        super().visit_Tuple(node, frame)
        self.write(")")

    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:
        self.write("environment.built(")
        super().visit_Dict(node, frame)
        self.write(")")


class BoundedSandbox(SandboxedEnvironment):
    """Jinja's sandbox with the work and sizes of each rendering bounded (see the module docstring)."""

    intercepted_binops = frozenset({"**", "*", "+", "%"})
    code_generator_class = BoundedCodeGenerator

    def __init__(self) -> None:
        super().__init__(
            loader=BaseLoader(),
            undefined=StrictUndefined,
            keep_trailing_newline=True,
            optimized=False,  # no folding pass: it would run filters at compile time
            finalize=self.handled,
        )
        self.ops_left = MAX_TEMPLATE_OPS
        self.deadline = time.monotonic() + MAX_RENDER_SECONDS
        self.compiled: dict[str, Template] = {}
        self.globals["range"] = self.bounded_range
        for name in REMOVED_GLOBALS:
            self.globals.pop(name, None)
        filters: dict[str, Callable[..., Any]] = {
            name: f for name, f in self.filters.items() if name not in REMOVED_FILTERS
        }
        filters["regex_replace"] = bounded_regex_replace(self.spend)
        self.filters = {name: self.bounded_filter(name, f) for name, f in filters.items()}

    def render(self, template: str, doc: Mapping[str, Any]) -> str:
        """`template` rendered with the fields of `doc`, within a fresh budget and deadline."""
        self.ops_left = MAX_TEMPLATE_OPS
        self.deadline = time.monotonic() + MAX_RENDER_SECONDS
        if template not in self.compiled:  # what Jinja folds at compile time is charged to this rendering
            self.compiled[template] = self.from_string(template)
        pieces, size = [], 0
        for piece in self.compiled[template].generate(**doc):
            size += len(piece)
            refuse_size("the rendering", size)
            self.spend(1 + len(piece) // CHARS_PER_OP)
            pieces.append(piece)
        return "".join(pieces)

    # ---- the budget

    def spend(self, n: int = 1) -> None:
        """Charge `n` operations; raises when the budget or the deadline is passed."""
        self.ops_left -= n
        if self.ops_left < 0:
            raise TemplateBudgetError(
                f"the template does more than {MAX_TEMPLATE_OPS} operations in one rendering (calls, lookups, "
                f"operators and loop steps, and one per item or {CHARS_PER_OP} characters of the values they handle)"
            )
        if time.monotonic() > self.deadline:
            raise TemplateBudgetError(
                f"the rendering ran for more than {MAX_RENDER_SECONDS:g} s (MAX_RENDER_SECONDS)"
            )

    def handled(self, value: Any) -> Any:
        """`value`, checked and charged as an input of an operation (or an output of the template)."""
        if isinstance(value, str) and len(value) < CHARS_PER_OP:
            return value  # the common case, at no cost beyond the operation itself
        weight, visited = weigh(value)
        if weight > MAX_VALUE_SIZE:
            raise TemplateBudgetError(
                f"the template handles a value of more than {MAX_VALUE_SIZE} characters or items "
                "(its items counted each time they appear)"
            )
        self.spend(visited + weight // CHARS_PER_OP)
        return value

    def built(self, value: Any) -> Any:
        """A value an operation built: checked and charged like an input, and one operation more."""
        self.spend()
        return self.handled(value)

    def counted_iter(self, iterable: Any) -> Any:
        for item in iterable:
            self.spend()
            yield item

    def bounded_range(self, *args: int) -> range:
        items = range(*args)
        try:
            self.spend(len(items))
        except OverflowError:
            raise TemplateBudgetError(f"range{args} is longer than {MAX_TEMPLATE_OPS} items") from None
        return items

    def bounded_concat(self, parts: tuple[Any, ...]) -> str:
        """`a ~ b ~ ...`: refused before joining when the parts together are too long."""
        refuse_size("a `~` concatenation", sum(weigh(part)[0] for part in self.handled(parts)))
        return self.built("".join(map(str, parts)))

    def concat(self, parts: Any) -> str:  # type: ignore[override]
        """The join of a block's output (a macro, `{% set %}...{% endset %}`, a filter block), bounded."""
        pieces, size = [], 0
        for piece in parts:
            size += len(piece)
            refuse_size("a block's output", size)
            pieces.append(piece)
        self.spend(1 + size // CHARS_PER_OP)
        return "".join(pieces)

    # ---- what templates call

    def bounded_filter(self, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        """`func` counted, with its inputs and result checked and its result size estimated where it can
        outgrow its inputs."""
        lead = 0 if getattr(func, "jinja_pass_arg", None) is None else 1  # the context Jinja passes first
        signature = inspect.signature(func) if name in ESTIMATED_FILTERS else None

        @functools.wraps(func)
        def bounded(*args: Any, **kwargs: Any) -> Any:
            self.spend()
            if name == "join" and len(args) > lead and not isinstance(args[lead], Sized):
                args = (*args[:lead], list(self.counted_iter(args[lead])), *args[lead + 1 :])
            self.handled(args[lead:])
            self.handled(kwargs)
            if signature is not None:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                check_filter(name, bound.arguments)
            return self.built(func(*args, **kwargs))

        return bounded

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.spend()
        method = getattr(obj, "__wrapped__", obj)  # Jinja wraps str.format in a sandboxed formatter
        owner, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
        if isinstance(obj, LoopContext) and args:  # `loop(children)` in a recursive loop: count its items
            args = (self.counted_iter(args[0]), *args[1:])
        elif (
            name == "join" and args and not isinstance(args[0], Sized)
        ):  # an iterator: its size must be known
            args = (list(self.counted_iter(args[0])), *args[1:])
        self.handled(args)
        self.handled(kwargs)
        check_method(name, owner, args, kwargs)
        return self.built(super().call(context, obj, *args, **kwargs))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        self.spend()
        self.handled((left, right))
        if operator == "**":
            check_power(left, right)
        elif operator == "*":
            check_int_product(left, right)
            check_repeat(left, right)
        elif operator == "+" and isinstance(left, (str, bytes, list, tuple)):
            refuse_size("a `+` of two sequences", weigh(left)[0] + weigh(right)[0])
        elif operator == "%":
            check_printf(left, right)
        return self.built(super().call_binop(context, operator, left, right))

    def getattr(self, obj: Any, attribute: str) -> Any:
        self.spend()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.spend()
        item = super().getitem(obj, argument)
        return self.built(item) if isinstance(argument, slice) else item  # a slice is a new value


_ENV: BoundedSandbox | None = None


def render_template(template: str, doc: Mapping[str, Any]) -> str:
    """A harness template rendered in the bounded sandbox (one environment per process, each template
    compiled once)."""
    global _ENV
    if _ENV is None:
        _ENV = BoundedSandbox()
    return _ENV.render(template, doc)
