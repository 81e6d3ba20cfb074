"""Runs the documentation pages' examples for tests/test_docs.py, in a process of its own, from the current
folder: first every import path the pages name, then each Python block that is run, in order, each in a fresh
namespace (as if pasted into `python`), then each `inloop-eval` command line, in order, through the command
line's entry point (`inloop_eval.cli.main`, what the `inloop-eval` script calls), in this one process so that
each does not pay for starting Python and importing torch again.

Usage: python doc_runner.py JOB.json, where JOB.json holds {"imports": [[module, attribute or null, page],
...], "blocks": [{"where": "page:line", "code": "..."}, ...], "commands": [{"where": "page:line", "argv":
[...]}]}. Exits 0 when every path imports, every block runs and every command exits 0; else 1, each failure on
stderr naming its page (and line).
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback


def check_import(module: str, attribute: str | None) -> None:
    """Import `module` and look `attribute` up in it; a dotted name that is not a module is tried as its
    parent module's attribute (`inloop_eval.models.gpt.GPT`)."""
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        parent, _, name = module.rpartition(".")
        if attribute is not None or exc.name != module or not parent:
            raise
        imported, attribute = importlib.import_module(parent), name
    if attribute is not None and not hasattr(imported, attribute):
        raise AttributeError(f"{imported.__name__} has no attribute {attribute!r}")


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    failures = 0
    for module, attribute, page in job["imports"]:
        try:
            check_import(module, attribute)
        except Exception as exc:  # every failure is reported, then the next path is tried
            failures += 1
            shown = f"{module}.{attribute}" if attribute else module
            print(f"import path {shown} ({page}): {type(exc).__name__}: {exc}", file=sys.stderr)
    for block in job["blocks"]:
        started = time.perf_counter()
        try:
            exec(compile(block["code"], block["where"], "exec"), {"__name__": "__main__"})
        except BaseException:  # a block that exits or raises is a failure of that block, named
            failures += 1
            print(f"block {block['where']} failed:\n{traceback.format_exc()}", file=sys.stderr)
            continue
        print(f"block {block['where']} ran in {time.perf_counter() - started:.1f} s", flush=True)
    for command in job["commands"]:
        failures += run_command(command["where"], command["argv"])
    return 1 if failures else 0


def run_command(where: str, argv: list[str]) -> int:
    """1 when `inloop-eval ARGV` fails (its exit status, or what it raised, on stderr), else 0."""
    from inloop_eval.cli import main as cli_main

    started = time.perf_counter()
    try:
        status = cli_main(argv)
    except SystemExit as exc:  # argparse's errors and --help end this way
        status = exc.code if isinstance(exc.code, int) else 1
    except Exception:
        print(f"command {where} `inloop-eval {' '.join(argv)}` raised:\n{traceback.format_exc()}", file=sys.stderr)
        return 1
    if status:
        print(f"command {where} `inloop-eval {' '.join(argv)}` exited {status}", file=sys.stderr)
        return 1
    print(f"command {where} ran in {time.perf_counter() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
