"""`inloop-eval`: list tasks, evaluate a saved model, compare evaluations, fetch task data. Works under
`torchrun`."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys
from dataclasses import dataclass
from types import ModuleType

from inloop_eval.errors import ConfigError, InLoopEvalError
from inloop_eval.frameworks import frameworks

HELP_FLAGS = ("-h", "--help")


@dataclass(frozen=True, kw_only=True)
class Command:
    """One subcommand: its name and one-line help, and the module that declares its arguments
    (`add_arguments(parser)`, or `flags`') and runs it (`run(args) -> int`), named by import path so that only
    the command that runs is imported (`inloop-eval --help` loads none)."""

    name: str
    help: str
    module: str
    flags: str = ""
    """The module that declares the arguments when it is not `module` (`add_arguments(parser)`), so that the
    command's `--help` loads none of what running it loads (torch); '' for `module` itself."""
    loads_saved_models: bool = False
    """The command loads a saved model folder, which needs a framework whose plugin loads them
    (`Framework.saved_models`) installed: checked before its module is imported (which may load torch), so
    that a missing one costs nothing."""


def saved_model_titles() -> str:
    """The frameworks whose saved model folders `evaluate --model` loads, for its help."""
    return ", ".join(p.title for p in frameworks() if p.saved_models)


COMMANDS: tuple[Command, ...] = (
    Command(
        name="tasks",
        help="list the registered tasks with their format and metrics",
        module="inloop_eval.cli.tasks",
    ),
    Command(
        name="lint",
        help="check tasks' choice strings and prompts; exit 1 on errors",
        module="inloop_eval.cli.lint",
    ),
    Command(
        name="evaluate",
        help=f"evaluate a saved model ({saved_model_titles()}) on tasks (torchrun-aware)",
        module="inloop_eval.cli.evaluate",
        flags="inloop_eval.cli.evaluate_flags",
        loads_saved_models=True,
    ),
    Command(
        name="demo",
        help="train the reference GPT with in-loop evaluation, then write the report (demo.yaml)",
        module="inloop_eval.demo.run",
    ),
    Command(
        name="report",
        help="HTML page of a run (acc / acc_norm / acc_pmi per task, perplexity per domain, flags), "
        "or of several runs compared",
        module="inloop_eval.report.command",
    ),
    Command(
        name="compare",
        help="is the difference real? two runs or steps paired on the documents both evaluated",
        module="inloop_eval.compare.command",
    ),
    Command(
        name="plan",
        help="the tasks, figures and documents that buy runs' decisions the most signal for a budget of seconds",
        module="inloop_eval.cli.plan",
        flags="inloop_eval.plan.flags",
    ),
    Command(
        name="watch",
        help="evaluate each checkpoint of a training run once it has landed (a sidecar)",
        module="inloop_eval.watch.command",
    ),
    Command(name="data", help="task data", module="inloop_eval.cli.data"),
)
BY_NAME = {command.name: command for command in COMMANDS}


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: the process's), run its command; the command's exit status, 2 on an error of
    the project's own (one line on stderr)."""
    argv = sys.argv[1:] if argv is None else argv
    name = next((a for a in argv if not a.startswith("-")), "")
    try:
        if not set(HELP_FLAGS) & set(argv):
            check_needs(BY_NAME.get(name))
        args = build_parser(name).parse_args(argv)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return int(command_module(BY_NAME[args.command]).run(args) or 0)
    except InLoopEvalError as exc:
        print(f"inloop-eval: error: {exc}", file=sys.stderr)
        return 2


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command in `COMMANDS`; the arguments of `command` only (None: of all of them), so
    that `--help` (command "") and each command import only the module they use."""
    parser = argparse.ArgumentParser(prog="inloop-eval", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for entry in COMMANDS:
        command_parser = sub.add_parser(entry.name, help=entry.help)
        if command in (None, entry.name):
            importlib.import_module(entry.flags or entry.module).add_arguments(command_parser)
    return parser


def command_module(command: Command) -> ModuleType:
    """The module that declares and runs `command`, imported now (once)."""
    return importlib.import_module(command.module)


def check_needs(command: Command | None) -> None:
    """ConfigError saying what to install when the command loads saved models and no framework that loads
    them is installed."""
    if command is None or not command.loads_saved_models:
        return
    plugins = [p for p in frameworks() if p.saved_models]
    if not any(importlib.util.find_spec(p.package) is not None for p in plugins):
        installs = " or ".join(f"`{p.package}`: pip install 'inloop_eval[{p.extra}]'" for p in plugins)
        raise ConfigError(f"{command.name} --model needs {installs or 'a framework that loads saved models'}")
