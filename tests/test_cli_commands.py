"""The ``pml-rank`` commands as a table (issue 30, item 3): each command one class in
``pml_rank_plugins.commands`` with its options (``add_arguments``) and its action (``run``);
the parser is built from ``COMMANDS``; shared option groups are declared once
(``commands/options.py``); ``main`` dispatches through the table, under the error guard."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

from pml_rank_plugins import cli
from pml_rank_plugins.cli import main
from pml_rank_plugins.cli_args import build_parser
from pml_rank_plugins.commands import COMMANDS, BadArgument, Command
from pml_rank_plugins.experiment import ConfigError

COMMANDS_DIR = Path(cli.__file__).resolve().parent / "commands"
# The options of the shared groups: declared in commands/options.py only.
SHARED = ("--set", "--device", "--data-root", "--allow-module", "--methods", "--resume",
          "--overwrite", "--reference", "--which")  # fmt: skip


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(parser: argparse.ArgumentParser) -> list[tuple]:
    """Every argument of ``parser`` as comparable tuples (not the ``--help`` action)."""
    return [
        (tuple(a.option_strings), a.dest, a.nargs, a.default, a.type, a.choices, a.required,
         a.help, a.metavar, type(a).__name__)  # fmt: skip
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction)
    ]


def test_the_parser_has_one_subcommand_per_row_of_the_table_in_its_order():
    assert list(_subparsers(build_parser())) == list(COMMANDS)
    assert list(COMMANDS) == [
        "train",
        "eval",
        "embed",
        "compare",
        "tune",
        "check",
        "sweep",
        "study",
        "list",
    ]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_has_its_own_parser_and_action(name):
    command = COMMANDS[name]
    assert issubclass(command, Command) and command.name == name
    # both defined by the command's class itself, not inherited from the base class
    assert "add_arguments" in vars(command) and "run" in vars(command), name
    assert "e.g." in command.help and command.__doc__
    # the subparser's arguments are exactly what the class declares
    alone = argparse.ArgumentParser()
    command().add_arguments(alone)
    sub = _subparsers(build_parser())[name]
    assert _options(sub) == _options(alone)
    assert len(_options(sub)) >= 2


def test_the_base_command_declares_and_does_nothing():
    with pytest.raises(NotImplementedError):
        Command().add_arguments(argparse.ArgumentParser())
    with pytest.raises(NotImplementedError):
        Command().run(argparse.Namespace())


def test_shared_options_are_declared_once_in_options_py():
    """No command module declares a shared option itself: it calls the group in options.py."""
    spelled = []
    for path in sorted(COMMANDS_DIR.glob("*.py")):
        if path.name == "options.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                names = [a.value for a in node.args if isinstance(a, ast.Constant)]
                spelled += [f"{path.name}:{node.lineno} {n}" for n in names if n in SHARED]
    assert not spelled, spelled
    text = (COMMANDS_DIR / "options.py").read_text()
    assert all(text.count(f'"{option}"') == 1 for option in SHARED)


@pytest.mark.parametrize("option", ["--set", "--device", "--data-root", "--allow-module"])
def test_a_shared_option_reads_the_same_in_every_command(option):
    seen = {}
    for name, sub in _subparsers(build_parser()).items():
        for action in sub._actions:
            if option in action.option_strings:
                seen[name] = (action.help, repr(action.default), action.metavar)
    assert len(seen) >= 5 and len(set(seen.values())) == 1, seen


def test_the_module_docstring_names_every_command_and_option():
    doc = cli.__doc__
    for name, sub in _subparsers(build_parser()).items():
        assert re.search(rf"^(torchrun .*)?pml-rank {name}\b", doc, re.M), name
        for action in sub._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    assert option in doc, (name, option)


class _Hello(Command):
    """A command added for the test: one table row is all it takes."""

    name = "hello"
    help = "say hello, e.g. pml-rank hello world"

    def add_arguments(self, parser):
        parser.add_argument("who", help="whom to greet, e.g. world")
        parser.add_argument("--fail", choices=["config", "value", "argument"], default=None)
        parser.add_argument("--device", default=None)
        parser.add_argument("--allow-module", action="append", default=[])

    def run(self, args):
        errors = {"config": ConfigError, "value": ValueError, "argument": BadArgument}
        if args.fail:
            raise errors[args.fail](f"no {args.who}")
        print(f"hello {args.who}")
        return 0


def test_a_new_command_is_one_row_of_the_table(monkeypatch, capsys):
    monkeypatch.setitem(COMMANDS, "hello", _Hello)
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "say hello, e.g." in capsys.readouterr().out
    assert main(["hello", "world"]) == 0
    assert capsys.readouterr().out == "hello world\n"
    # run under the guard: a config error exits 2, a failed run 1, a bad argument 2; one line each
    for fail, code, line in [
        ("config", 2, "pml-rank: config error: no world\n"),
        ("value", 1, "pml-rank: error: no world\n"),
        ("argument", 2, "pml-rank: error: no world\n"),
    ]:
        assert main(["hello", "world", "--fail", fail]) == code
        assert capsys.readouterr().err == line
    # the guard checks --device before the action runs
    assert main(["hello", "world", "--device", "tpu"]) == 2
    assert "--device tpu: not a device" in capsys.readouterr().err
