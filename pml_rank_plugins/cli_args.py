"""The ``pml-rank`` argument parser, built from the table of commands.

Each command declares its own options (``add_arguments`` of its class in
:mod:`pml_rank_plugins.commands`, listed in ``COMMANDS``); the option groups several commands share
are declared once in :mod:`pml_rank_plugins.commands.options`. Standard library only, so
``pml-rank --help`` and argument errors answer without importing torch;
:mod:`pml_rank_plugins.cli` runs the commands.
"""

from __future__ import annotations

import argparse

from ._version import __version__
from .commands import COMMANDS
from .commands.options import CONFIG_HELP, CONFIGS_HELP, DEVICE_FORMS, LIST_KINDS

__all__ = ["CONFIGS_HELP", "CONFIG_HELP", "DEVICE_FORMS", "EPILOG", "LIST_KINDS", "build_parser"]

EPILOG = """examples:
  pml-rank compare default --out runs/default           # shipped config, every method
  pml-rank train configs/default.yaml --method "plugin FastAP" --out runs/fastap
  pml-rank train default --method "plugin FastAP" --out runs/fastap --resume \\
      --set trainer.num_epochs=12                         # extend a finished run
  pml-rank eval runs/fastap --which latest
  pml-rank embed runs/fastap --split test --out test.npz
  pml-rank list FastAP
  pml-rank list --kind losses
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``pml-rank`` argument parser: the options every command takes (``-v``, ``--version``,
    ``--debug``), then one subparser per row of ``COMMANDS`` (its ``help`` line, its
    ``add_arguments``), in the table's order."""
    p = argparse.ArgumentParser(
        prog="pml-rank",
        description="Command line interface ``pml-rank`` (also ``python -m pml_rank_plugins``).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="log PML's INFO messages and full tracebacks"
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument(
        "--debug",
        action="store_true",
        help="print the full traceback of an error (otherwise one line naming the file or key)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        command().add_arguments(sub.add_parser(name, help=command.help))
    return p
