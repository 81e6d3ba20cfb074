"""What one template rendering may build, and the checks that refuse an operation before it allocates.

Guarantees: no value a rendering builds or hands to an operation weighs more than `MAX_VALUE_SIZE`; integers it
computes stay under `MAX_INT_BITS`; an operation whose result size follows from its arguments (a width, a repeat
count, a separator, a replacement, a format spec) is refused before it runs when that size would pass the limit.
The sandbox (`sandbox`) applies these to every call, filter, operator, literal, concatenation and output.

Weight: the characters of a string (bytes of bytes), about the decimal digits of an integer, 1 for any other
scalar, and for a container 1 plus its items' weights, an item counted each time it appears (as printing or
comparing visits it), so a structure that shares itself cannot hide an exponential size.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable, Mapping
from typing import Any

from jinja2.exceptions import SecurityError
from jinja2.utils import Namespace

MAX_VALUE_SIZE = 1_000_000  # weight of any value a rendering builds or handles, and of its output
MAX_INT_BITS = 4096  # integers `*` and `**` compute

# Integer parameters that set the size of a result (a width, a count of pieces): at most MAX_VALUE_SIZE.
SIZE_PARAMETERS: dict[str, tuple[str, ...]] = {
    "center": ("width",),
    "indent": ("width",),
    "wordwrap": ("width",),
    "truncate": ("length", "leeway"),
    "batch": ("linecount",),
    "slice": ("slices",),
    "round": ("precision",),
}
# Filters whose result size is estimated from their arguments before they run.
ESTIMATED_FILTERS = frozenset({*SIZE_PARAMETERS, "replace", "join", "format", "sum"})

# A printf spec (`%-10.3f`, `%(name)s`, `%*d`): its width and precision.
_PRINTF_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


class TemplateBudgetError(SecurityError):
    """A template asked for more work or a bigger value than one rendering may have."""


def weigh(value: Any, limit: int = MAX_VALUE_SIZE) -> tuple[int, int]:
    """(weight, items visited) of `value`; stops early once the weight passes `limit` (so cycles end too)."""
    weight = visited = 0
    stack = [value]
    while stack and weight <= limit:
        item = stack.pop()
        visited += 1
        if isinstance(item, (str, bytes, bytearray)):
            weight += len(item)
        elif isinstance(item, int):
            weight += item.bit_length() // 3 + 1
        elif isinstance(item, (list, tuple, set, frozenset)):
            weight += 1
            stack.extend(item)
        elif isinstance(item, Mapping):
            weight += 1
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, Namespace):  # printed with its attributes
            weight += 1
            stack.extend(getattr(item, "_Namespace__attrs", {}).values())
        else:
            weight += 1
    return weight, visited


def refuse_size(what: str, size: int) -> None:
    """Raise when `what` would be longer than `MAX_VALUE_SIZE`."""
    if size > MAX_VALUE_SIZE:
        raise TemplateBudgetError(
            f"{what} would be {size} characters or items long; at most {MAX_VALUE_SIZE} are allowed"
        )


def refuse_width(what: str, value: Any) -> None:
    """Raise when an integer parameter that sets a result's size is beyond `MAX_VALUE_SIZE`."""
    if isinstance(value, int) and abs(value) > MAX_VALUE_SIZE:
        raise TemplateBudgetError(f"{what} {value} is beyond the limit of {MAX_VALUE_SIZE}")


def check_int_product(left: Any, right: Any) -> None:
    """`left * right` on integers: refused when the product would need more than `MAX_INT_BITS` bits."""
    if _int(left) and _int(right):
        bits = left.bit_length() + right.bit_length()
        if bits > MAX_INT_BITS:
            raise TemplateBudgetError(
                f"a product of {left.bit_length()}-bit and {right.bit_length()}-bit integers would have up to "
                f"{bits} bits; at most {MAX_INT_BITS} are allowed"
            )


def check_power(left: Any, right: Any) -> None:
    """`left ** right` on integers: refused when the result would need more than `MAX_INT_BITS` bits."""
    if _int(left) and _int(right) and right > 0 and abs(left) > 1:
        bits = math.inf if right.bit_length() > 256 else right * math.log2(abs(left))
        if bits > MAX_INT_BITS:
            shown_left = left if left.bit_length() <= 64 else f"a {left.bit_length()}-bit integer"
            raise TemplateBudgetError(
                f"{shown_left} ** {right} would have about {bits:.3g} bits; at most {MAX_INT_BITS} are allowed"
            )


def check_repeat(left: Any, right: Any) -> None:
    """`seq * n` on a string, bytes or list: refused when the result would weigh more than `MAX_VALUE_SIZE`."""
    for seq, n in ((left, right), (right, left)):
        if isinstance(seq, (str, bytes, list, tuple)) and _int(n) and n > 1:
            size = len(seq) * n if isinstance(seq, (str, bytes)) else weigh(seq)[0] * n
            if size > MAX_VALUE_SIZE:
                raise TemplateBudgetError(
                    f"repeating a {type(seq).__name__} of length {len(seq)} {n} times is longer than "
                    f"{MAX_VALUE_SIZE}"
                )


def check_printf(fmt: Any, args: Any) -> None:
    """`fmt % args`: widths and precisions (written, or taken from `args` by `*`) up to `MAX_VALUE_SIZE`."""
    if not isinstance(fmt, (str, bytes)):
        return
    text = fmt if isinstance(fmt, str) else fmt.decode("latin-1")
    star = False
    for spec in _PRINTF_SPEC.finditer(text):
        for number in spec.groups():
            star = star or number == "*"
            if number and number != "*":
                _refuse_digits(f"the format {spec.group()!r}", number)
    if star:
        for value in args if isinstance(args, tuple) else (args,):
            refuse_width("a `*` width or precision", value)


def check_format_call(fmt: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """`fmt.format(*args, **kwargs)`: the widths and precisions of its specs up to `MAX_VALUE_SIZE`."""
    for _, field, spec, _ in string.Formatter().parse(fmt):
        if field is None or not spec:
            continue
        if "{" in spec:  # a nested field takes its width from the arguments
            for value in (*args, *kwargs.values()):
                refuse_width(f"a width given to {{:{spec}}}", value)
        for number in re.findall(r"\d+", spec):
            _refuse_digits(f"the format spec {spec!r}", number)


def check_method(name: str, owner: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """A method call on a string, bytes or integer whose result size follows from its arguments."""
    if isinstance(owner, int) and name == "to_bytes":
        refuse_width("to_bytes length", args[0] if args else kwargs.get("length"))
    if not isinstance(owner, (str, bytes)):
        return
    check = _TEXT_METHOD_CHECKS.get(name)
    if check is not None:
        check(name, owner, args, kwargs)


def _check_padding(name: str, owner: str | bytes, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    if args:
        refuse_width(f"{name} width", args[0])


def _check_expandtabs(
    name: str, owner: str | bytes, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> None:
    tabsize = args[0] if args else kwargs.get("tabsize", 8)
    refuse_width("expandtabs tabsize", tabsize)
    if _int(tabsize):
        tabs = owner.count("\t" if isinstance(owner, str) else b"\t")
        refuse_size("expandtabs", len(owner) + tabs * tabsize)


def _check_replace(name: str, owner: str | bytes, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    if len(args) >= 2:
        refuse_size("replace", _replaced_size(owner, args[0], args[1], args[2] if len(args) > 2 else -1))


def _check_join(name: str, owner: str | bytes, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    if args:
        refuse_size("join", _joined_size(owner, args[0]))


def _check_translate(name: str, owner: str | bytes, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    if args and isinstance(args[0], Mapping):
        longest = max((len(v) for v in args[0].values() if isinstance(v, (str, bytes))), default=1)
        refuse_size("translate", len(owner) * max(1, longest))


def _check_format(name: str, owner: str | bytes, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    if not isinstance(owner, str):
        return
    mapping = args[0] if name == "format_map" and args and isinstance(args[0], Mapping) else kwargs
    check_format_call(owner, args if name == "format" else (), mapping)


# String and bytes methods whose result size follows from their arguments -> the check of those arguments.
_TEXT_METHOD_CHECKS: dict[str, Callable[[str, str | bytes, tuple[Any, ...], Mapping[str, Any]], None]] = {
    "center": _check_padding,
    "ljust": _check_padding,
    "rjust": _check_padding,
    "zfill": _check_padding,
    "expandtabs": _check_expandtabs,
    "replace": _check_replace,
    "join": _check_join,
    "translate": _check_translate,
    "format": _check_format,
    "format_map": _check_format,
}


def check_filter(name: str, arguments: Mapping[str, Any]) -> None:
    """A filter call (its arguments bound by name) whose result size follows from its arguments."""
    for parameter in SIZE_PARAMETERS.get(name, ()):
        refuse_width(f"{name}({parameter}=...)", arguments.get(parameter))
    if name == "replace":
        text = _text(arguments["s"])
        count = arguments.get("count")
        old, new = str(arguments["old"]), str(arguments["new"])
        refuse_size("replace", _replaced_size(text, old, new, -1 if count is None else count))
    elif name == "join":
        refuse_size("join", _joined_size(str(arguments.get("d", "")), arguments["value"]))
    elif name == "indent":
        text, width = _text(arguments["s"]), arguments.get("width", 4)
        pad = width if _int(width) else len(str(width))
        refuse_size("indent", len(text) + (text.count("\n") + 1) * pad)
    elif name == "wordwrap":
        text, width = _text(arguments["s"]), arguments.get("width", 79)
        wrap = arguments.get("wrapstring") or "\n"
        if _int(width) and width > 0:
            refuse_size("wordwrap", len(text) + (len(text) // width + text.count("\n") + 1) * len(str(wrap)))
    elif name == "format":
        check_printf(_text(arguments["value"]), tuple(arguments.get("args", ())) or arguments.get("kwargs"))
    elif name == "sum":
        start = arguments.get("start", 0)
        if not isinstance(start, (int, float)):  # adding sequences copies them again at every item
            raise TemplateBudgetError(
                f"sum(start={type(start).__name__}) adds sequences; templates sum numbers"
            )


def _replaced_size(text: Any, old: Any, new: Any, count: Any) -> int:
    if not (isinstance(text, (str, bytes)) and type(old) is type(text) and type(new) is type(text)):
        return 0
    found = len(text) + 1 if not old else text.count(old)
    if _int(count) and count >= 0:
        found = min(found, count)
    return len(text) + found * max(0, len(new) - len(old))


def _joined_size(separator: Any, items: Any) -> int:
    if not isinstance(separator, (str, bytes)) or not isinstance(items, (list, tuple)):
        return 0
    return weigh(items)[0] + max(0, len(items) - 1) * len(separator)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def _refuse_digits(what: str, digits: str) -> None:
    if len(digits) > len(str(MAX_VALUE_SIZE)) or int(digits) > MAX_VALUE_SIZE:
        raise TemplateBudgetError(
            f"{what} asks for {digits[:12]} characters; at most {MAX_VALUE_SIZE} are allowed"
        )


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
