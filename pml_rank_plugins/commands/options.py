"""The option groups several ``pml-rank`` commands share, each declared once.

Standard library only (``pml-rank --help`` and argument errors answer without importing torch).
A command's ``add_arguments`` calls the groups it takes; the table below says which take which.

=========================  =================================================================
group                      commands
=========================  =================================================================
:func:`add_common`         ``--set``, ``--device``, ``--data-root``, ``--allow-module``:
                           train, compare, tune, check, sweep, study
:func:`add_device`         eval, embed (with :func:`add_data_root`)
:func:`add_data_root`      ``--data-root``, ``--allow-module``: eval, embed
:func:`add_methods`        ``--methods A,B``: compare, tune, check, study
:func:`add_resume`         ``--resume`` and ``--overwrite``: train, compare, sweep; study
                           (``--resume`` only)
:func:`add_stats`          ``--reference`` and ``--jobs``: compare, sweep, study
:func:`add_which`          ``--which best|latest``: eval, embed
:func:`add_compile`        ``--compile`` (:func:`compile_overrides`): train, compare, tune,
                           study
=========================  =================================================================
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = [
    "CONFIGS_HELP",
    "CONFIG_HELP",
    "DEVICE_FORMS",
    "LIST_KINDS",
    "RUN_DIR_HELP",
    "add_common",
    "add_compile",
    "add_data_root",
    "add_device",
    "add_methods",
    "add_resume",
    "add_stats",
    "add_which",
    "compile_overrides",
]

DEVICE_FORMS = "cpu, cuda, cuda:N or mps"
CONFIG_HELP = "YAML file or shipped config name, e.g. default, omniglot or configs/default.yaml"
CONFIGS_HELP = "YAML files or shipped config names, e.g. default or ablations/fastap_bins"
RUN_DIR_HELP = "the --out of a train run, e.g. runs/fastap"

# The groups of `pml-rank list`; the same tuple as experiment.registry.KINDS (kept here so that
# argument errors answer without importing torch; a test checks the two agree).
LIST_KINDS = (
    "losses",
    "miners",
    "samplers",
    "trainers",
    "datasets",
    "models",
    "optimizers",
    "other",
)


def add_common(parser: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE`` (repeatable), then :func:`add_device` and :func:`add_data_root`."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value (dotted path, YAML value), repeatable, e.g. "
        "--set trainer.num_epochs=2 --set 'optimizers.trunk_optimizer={Adam: {lr: 1e-4}}'",
    )
    add_device(parser)
    add_data_root(parser)


def add_device(parser: argparse.ArgumentParser) -> None:
    """``--device`` (default None: the config's)."""
    parser.add_argument(
        "--device",
        default=None,
        help=f"torch device ({DEVICE_FORMS}), e.g. --device cuda:0 (default: the config's)",
    )


def add_data_root(parser: argparse.ArgumentParser) -> None:
    """``--data-root DIR`` and ``--allow-module MODULE`` (repeatable)."""
    parser.add_argument(
        "--data-root",
        default=None,
        metavar="DIR",
        help="folder that relative dataset roots and weights paths start from, e.g. "
        "--data-root /data (CUB at /data/CUB_200_2011); default $PML_RANK_DATA",
    )
    # Loading configs or run folders resolves class names: this widens what may be imported.
    parser.add_argument(
        "--allow-module",
        action="append",
        default=[],
        metavar="MODULE",
        help="let configs name classes from this module (repeatable), e.g. "
        "--allow-module my_project.losses",
    )


def add_methods(parser: argparse.ArgumentParser) -> None:
    """``--methods A,B`` (default None: every method of the configs)."""
    parser.add_argument(
        "--methods",
        default=None,
        help='comma-separated subset of method names, e.g. --methods "PML FastAP,plugin FastAP"',
    )


def add_resume(parser: argparse.ArgumentParser, resume_help: str, overwrite: bool = True) -> None:
    """``--resume`` (what it continues differs by command: ``resume_help``) and, with
    ``overwrite``, ``--overwrite`` (``study`` has none: its tuning storage is never replaced)."""
    parser.add_argument("--resume", action="store_true", help=resume_help)
    if not overwrite:
        return
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace what a run folder already holds (otherwise refused unless --resume)",
    )


def add_stats(parser: argparse.ArgumentParser, what: str) -> None:
    """``--reference NAME`` (the ``what``, method or cell, compared with) and ``--jobs K``."""
    parser.add_argument(
        "--reference",
        default=None,
        metavar="NAME",
        help=f"the {what} the others are compared with, paired by seed (default: the first),"
        + (' e.g. --reference "PML FastAP"' if what == "method" else " e.g. num_bins=10"),
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="K",
        help="run K trainings at once in worker processes (one GPU each, round robin, when"
        " several are visible); results equal --jobs 1, e.g. --jobs 2",
    )


def add_which(parser: argparse.ArgumentParser, verb: str) -> None:
    """``--which best|latest``: the checkpoint to ``verb`` (default best)."""
    parser.add_argument(
        "--which",
        default="best",
        choices=["best", "latest"],
        help=f"checkpoint to {verb}, e.g. --which latest (default best)",
    )


# What --compile stands for: the first --set, so that an explicit --set trainer.compile=... wins.
COMPILE_OVERRIDE = "trainer.compile=true"


def add_compile(parser: argparse.ArgumentParser) -> None:
    """``--compile``: ``torch.compile`` the models and losses (``trainer.compile: true``)."""
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the models and losses (as --set trainer.compile=true; a --set "
        "trainer.compile={backend: aot_eager} chooses the backend, mode, fullgraph), e.g. "
        "--compile; compile time goes to the log and metrics.json",
    )


def compile_overrides(args: Any) -> list[str]:
    """``args.overrides`` with ``--compile`` as the first ``--set`` (see :func:`add_compile`)."""
    return ([COMPILE_OVERRIDE] if getattr(args, "compile", False) else []) + list(args.overrides)
