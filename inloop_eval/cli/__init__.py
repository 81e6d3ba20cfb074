"""The `inloop-eval` command line (`python -m inloop_eval.cli`): `main` holds the table of commands (name,
help, the module that declares and runs it, named by import path and imported only when that command runs)
and dispatches; each command's module has `add_arguments(parser)` (or names a module of its flags that
loads no torch) and `run(args) -> int`. Here: `tasks` (`tasks`, with `describe` rendering `tasks
--describe`), `lint`, `evaluate` (`evaluate_flags`, and the command in phases, ending with
`loggers.summary`'s table), `plan` (run directories planned by the `plan` package, or `--calibrate`'s
checkpoints evaluated by `evaluate`'s functions first) and `data` (fetch, verify, make-lm); `demo`, `report`,
`compare` and `watch` live in their own packages."""

from inloop_eval.cli.main import main

__all__ = ["main"]
