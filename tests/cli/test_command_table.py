"""The command line is a table: each command's module declares its arguments and runs them, and `main` only
lists the commands and dispatches."""

from __future__ import annotations

import importlib

import pytest

from inloop_eval.cli.main import COMMANDS, main


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_each_commands_module_declares_its_arguments_and_runs_them(command, capsys):
    module = importlib.import_module(command.module)
    flags = importlib.import_module(command.flags or command.module)
    assert callable(flags.add_arguments) and callable(module.run)
    with pytest.raises(SystemExit) as caught:
        main([command.name, "--help"])
    assert caught.value.code == 0
    usage = " ".join(capsys.readouterr().out.split("\n\n")[0].split())
    assert usage.startswith(f"usage: inloop-eval {command.name} [-h] ") and len(usage) > 40, usage


def test_help_lists_every_command_of_the_table_in_order(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    assert f"{{{','.join(c.name for c in COMMANDS)}}}" in out
    for command in COMMANDS:
        assert command.help.split(" (")[0] in " ".join(out.split())
