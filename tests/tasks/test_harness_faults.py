"""Untrusted harness YAML fails its task within seconds, with a message naming task, document, field and limit:
templates whose work the operation count missed (backtracking regexes, `lipsum`, huge widths, big integers,
doubling strings), `include:`s of files outside the named folder, named pipes, devices and oversized or
invalid files (never echoing their text), and JSON data with half a surrogate pair."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2.sandbox
import pytest

from inloop_eval.errors import TaskDataError
from inloop_eval.tasks import get_task, load_docs
from inloop_eval.tasks.harness import sandbox

TASK_YAML = """\
task: local
dataset_path: json
dataset_kwargs: {{data_files: {{validation: rows.jsonl}}}}
output_type: multiple_choice
validation_split: validation
doc_to_text: {text}
doc_to_target: 0
doc_to_choice: ["yes", "no"]
"""


def write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def template_task(folder: Path, template: str, q: str = "q", n_docs: int = 4) -> Any:
    """A local JSON task of `n_docs` rows `{"q": q}` whose `doc_to_text` is `template`."""
    rows = "".join(json.dumps({"q": q}) + "\n" for _ in range(n_docs))
    write(folder, {"t.yaml": TASK_YAML.format(text=json.dumps(template)), "rows.jsonl": rows})
    return get_task(f"harness:{folder / 't.yaml'}")


def finishes_within(seconds: float, fn: Callable[[], Any], unblock: Callable[[], None] = lambda: None) -> Any:
    """`fn()`'s result or exception, failing the test (not hanging it) when it runs longer than `seconds`."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except Exception as exc:  # returned to the test, which checks what was raised
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        unblock()
        thread.join(10)
        pytest.fail(f"still running after {seconds} s")
    return out.get("error", out.get("value"))


# ---- templates: the budget counts work


@pytest.mark.parametrize(
    ("template", "q", "fragment"),
    [
        # exponential backtracking: 27 'a's took 31 s for 4 documents, each more 'a' doubling it
        ("{{ q|regex_replace('(a+)+$', '') }}", "a" * 27 + "!", "repeats a part that itself repeats"),
        # two repeats in a row: n^3 steps (1,000 characters took 2 s, 4,000 took 200 s)
        ("{{ q|regex_replace('\\\\s*\\\\s*$', '') }}", " " * 1000 + "x", "it may scan at most 464"),
        ("{{ lipsum(n=2000) }}", "q", "'lipsum' is undefined"),
        ("{{ q.center(50000000) }}", "q", "center width 50000000 is beyond the limit of 1000000"),
        ("{{ q|center(50000000) }}", "q", "center(width=...) 50000000 is beyond the limit of 1000000"),
        ("{{ '%50000000s' % q }}", "q", "the format '%50000000s' asks for 50000000 characters"),
        ("{{ '{:>{}}'.format(q, 50000000) }}", "q", "50000000 is beyond the limit of 1000000"),
        ("{{ q|replace('', q) }}", "x" * 5000, "replace would be 25010000 characters"),
        (
            "{% set ns = namespace(x=3) %}{% for i in range(22) %}{% set ns.x = ns.x * ns.x %}{% endfor %}"
            "{{ ns.x % 7 }}",
            "q",
            "a product of 3247-bit and 3247-bit integers would have up to 6494 bits; at most 4096",
        ),
        (
            "{% set ns = namespace(x=q) %}{% for i in range(22) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}"
            "{{ ns.x|length }}",
            "ab",
            "handles a value of more than 1000000 characters",
        ),
        # a loop whose body does nothing counted: each step counts now
        (
            "{% for c in q %}{% for d in q %}{% endfor %}{% endfor %}",
            "x" * 3000,
            "more than 1000000 operations",
        ),
        (
            "{% for i in range(3000) %}{{ q }}{% endfor %}",
            "x" * 1000,
            "the rendering would be 1001000 characters",
        ),
    ],
)
def test_templates_that_work_long_fail_their_task_within_seconds(tmp_path, data_root, template, q, fragment):
    task = template_task(tmp_path, template, q)
    start = time.monotonic()
    with pytest.raises(TaskDataError) as info:
        load_docs(task, data_root)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert message.startswith(f"task 'harness:{tmp_path / 't.yaml'}' doc 0: doc_to_text "), message
    assert "template failed (" in message and fragment in message, message


@pytest.mark.parametrize("template", ["{{ '9' * 5000 }}", "{{ '0' ~ q }}", "²"])
def test_digits_that_are_not_an_index_are_named(tmp_path, data_root, template):
    """Rendered digits are read as a choice index: a number over 4300 digits, a leading zero or a superscript
    is an error naming the document and field, not a bare ValueError or SyntaxError."""
    with pytest.raises(TaskDataError, match=r"doc 0: doc_to_text: expected a choice index, found the digits"):
        load_docs(template_task(tmp_path, template, q="1"), data_root)


def test_a_rendering_stops_at_its_deadline(tmp_path, data_root, monkeypatch):
    """Work the counts undervalue still ends: each rendering has a wall-clock deadline."""
    monkeypatch.setattr(sandbox, "MAX_RENDER_SECONDS", 0.05)
    task = template_task(tmp_path, "{% for i in range(300000) %}{% endfor %}{{ q }}")
    with pytest.raises(TaskDataError, match=r"doc 0: doc_to_text .* the rendering ran for more than 0.05 s"):
        load_docs(task, data_root)


@pytest.mark.parametrize(
    "template",
    [
        "{{ q|regex_replace('(\\\\w+)-(\\\\w+)', '\\\\2 \\\\1') }}|{{ q|regex_replace('\\\\s+', ' ', 1) }}",
        "{{ '%-6s|%5.2f|%%' % (q, 3.14159) }}{{ '%(a)s' % {'a': q} }}{{ '%*d' % (5, 42) }}",
        "{{ '{:>8}|{:.3}|{x!r}'.format(q, 'abcdef', x=[1, 2]) }}",
        "{{ q|center(12) }}{{ q|indent(2, true) }}{{ (q ~ ' ') * 3 }}{{ [q, q]|join(', ') }}",
        "{{ q|wordwrap(4) }}{{ q|truncate(9) }}{{ q|replace('b', 'BB') }}{{ [1, 2.5]|sum(start=1) }}",
        "{% for x in [1, [2, 3]] recursive %}{% if x is iterable %}{{ loop(x) }}{% else %}{{ x }}{% endif %}"
        "{% endfor %}{{ {'k': q}['k'] }}{{ (2 ** 100) % 97 }}{{ 12 * 34 }}{{ range(4)|sum }}{{ q[::-1] }}",
        "{% macro m(x) %}<{{ x }}>{% endmacro %}{{ m(q) }}{% set b %}{{ q|upper }}{% endset %}{{ b }}"
        "{{ q.ljust(9, '.') }}{{ q.zfill(12) }}{{ ','.join(q.split('-')) }}{{ q|title }}",
    ],
)
def test_bounded_templates_render_as_jinja_does(template):
    doc = {"q": "ab-cd efg\tx"}
    expected = jinja2.sandbox.SandboxedEnvironment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True
    )
    expected.filters["regex_replace"] = lambda s, p, r, count=0: re.sub(p, r, s, count=count)
    assert sandbox.render_template(template, doc) == expected.from_string(template).render(**doc)
