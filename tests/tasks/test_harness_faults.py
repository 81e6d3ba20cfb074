"""Untrusted harness YAML fails its task within seconds, with a message naming task, document, field and limit:
templates whose work the operation count missed (backtracking regexes, `lipsum`, huge widths, big integers,
doubling strings), `include:`s of files outside the named folder, named pipes, devices and oversized or
invalid files (never echoing their text), and JSON data with half a surrogate pair."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2.sandbox
import pytest

from inloop_eval.errors import ConfigError, TaskDataError
from inloop_eval.tasks import get_task, load_docs
from inloop_eval.tasks.harness import sandbox
from inloop_eval.tasks.harness.loader import MAX_YAML_BYTES, load_yaml

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
    """Work the counts undervalue still ends: each rendering has a wall-clock deadline. The sandbox's clock is
    one that moves 10 ms at each reading, so the deadline passes on any machine, however fast."""

    class SlowClock:
        now = 0.0

        def monotonic(self):
            self.now += 0.01
            return self.now

    monkeypatch.setattr(sandbox, "time", SlowClock())
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


# ---- include: confined to the named folder, regular files only, text never echoed


@pytest.mark.parametrize(
    "include",
    ["{outside}/secrets.yaml", "../outside/secrets.yaml", "/dev/zero", "zero.yaml"],
    ids=["absolute", "relative", "device", "link-to-device"],
)
def test_an_include_outside_the_folder_is_refused_before_it_is_read(tmp_path, include):
    """Files outside (a secret that would not parse, /dev/zero, a link to it) are never opened."""
    write(tmp_path / "outside", {"secrets.yaml": 'api_key: "sk-live-1234567890\n'})
    include = include.format(outside=tmp_path / "outside")
    write(tmp_path / "named", {"t.yaml": f"include: {include}\ntask: t\n"})
    (tmp_path / "named" / "zero.yaml").symlink_to("/dev/zero")
    error = finishes_within(10, lambda: get_task(f"harness:{tmp_path / 'named' / 't.yaml'}"))
    assert isinstance(error, ConfigError), error
    assert f"(named by `include:` in {tmp_path / 'named' / 't.yaml'}) is outside the task folder" in str(
        error
    )
    assert "files are read only from the folder you name" in str(error) and "sk-live" not in str(error)


def test_an_include_of_a_named_pipe_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    write(tmp_path, {"t.yaml": "include: pipe.yaml\ntask: t\n"})

    def unblock() -> None:  # the old reader waits in open() for a writer: give it one that writes nothing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    error = finishes_within(10, lambda: get_task(f"harness:{tmp_path / 't.yaml'}"), unblock)
    assert isinstance(error, ConfigError), error
    assert (
        f"harness YAML {fifo} (named by `include:` in {tmp_path / 't.yaml'}) is a named pipe (FIFO)"
        in str(error)
    )


def test_a_parse_error_names_line_and_column_not_the_text(tmp_path):
    write(
        tmp_path, {"base.yaml": 'task: b\napi_key: "sk-live-1234567890\n', "t.yaml": "include: base.yaml\n"}
    )
    with pytest.raises(ConfigError) as info:
        load_yaml(tmp_path / "t.yaml")
    message = str(info.value)
    assert (
        f"harness YAML {tmp_path / 'base.yaml'} (named by `include:` in {tmp_path / 't.yaml'}): not valid"
        in message
    )
    assert "line 3 column 1: while scanning a quoted scalar; found unexpected end of stream" in message
    assert "sk-live" not in message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("task: t\ndoc_to_text: '" + "x" * MAX_YAML_BYTES + "'\n", f"is larger than {MAX_YAML_BYTES} bytes"),
        # aliases that repeat a list within a list: 10 ** 9 choices from a few hundred bytes
        (
            "task: t\nl0: &l0 [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 9))
            + "doc_to_choice: [*l8]\n",
            "its aliases expand to more than",
        ),
        ("include: [" + ", ".join(["base.yaml"] * 65) + "]\ntask: t\n", "read more than 64 files"),
        ("include: [base.yaml, 7]\ntask: t\n", "`include:` expected file names, found 7"),
    ],
)
def test_oversized_and_malformed_task_files_are_refused(tmp_path, text, fragment):
    write(tmp_path, {"t.yaml": text, "base.yaml": "output_type: multiple_choice\n"})
    error = finishes_within(20, lambda: get_task(f"harness:{tmp_path / 't.yaml'}"))
    assert isinstance(error, ConfigError) and fragment in str(error), error


def test_a_group_files_inline_include_is_confined_too(tmp_path):
    write(tmp_path / "outside", {"base.yaml": "task: b\n"})
    group = "group: g\ntask:\n  - {task: b, include: ../outside/base.yaml}\n"
    write(tmp_path / "named", {"g.yaml": group})
    with pytest.raises(ConfigError, match="outside/base.yaml is outside the task folder"):
        get_task(f"harness:{tmp_path / 'named'}#b")


# ---- data files


def test_json_with_half_a_surrogate_pair_names_file_line_and_column(tmp_path, data_root):
    task = template_task(tmp_path, "{{ q }}")
    (tmp_path / "rows.jsonl").write_text('{"q": "fine \\ud83d\\ude00"}\n{"q": "bad \\ud800 x"}\n')
    with pytest.raises(TaskDataError) as info:
        load_docs(task, data_root)
    assert (
        f"data file {tmp_path / 'rows.jsonl'} line 2: \\ud800 at column 12 is half of a surrogate pair"
        in str(info.value)
    )
    (tmp_path / "rows.jsonl").write_text('{"q": "fine \\ud83d\\ude00"}\n')
    (doc,) = load_docs(task, data_root)
    assert doc.contexts[0] == "fine \U0001f600"
