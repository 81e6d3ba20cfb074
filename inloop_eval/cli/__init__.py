"""The `inloop-eval` command line (`python -m inloop_eval.cli`): `main` parses and dispatches the
commands; `describe` renders `tasks --describe`."""

from inloop_eval.cli.main import main

__all__ = ["main"]
