"""The `inloop-eval` command line (`python -m inloop_eval.cli`): `main` parses and dispatches the
commands, each importing its own modules when it runs; `evaluate` is the `evaluate` command in phases;
`progress` shows an evaluation's progress per task (also the demo's); `summary` is the table `evaluate`
ends with; `describe` renders `tasks --describe`."""

from inloop_eval.cli.main import main

__all__ = ["main"]
