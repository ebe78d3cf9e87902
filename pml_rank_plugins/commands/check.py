"""``pml-rank check``: build every object of every method without training."""

from __future__ import annotations

import argparse
import contextlib
import logging

from .base import Command, check_config_devices, config_paths, data_root, load, methods
from .options import CONFIGS_HELP, add_common, add_methods

__all__ = ["Check"]


class Check(Command):
    """Build every selected method of CONFIG... on ``--device`` (or the CPU) and read every image
    file's header (``--no-scan``: none); print one line per method (or config) saying what was
    built, then ``  data: PATH: reason`` for each file the data does not use. Without ``--device`` each method's ``device:`` must
    exist on this machine, as ``train`` requires (``--device cpu`` checks a config written for
    another machine)."""

    name = "check"
    help = (
        "build every object of every method without training, e.g. "
        "pml-rank check benchmarks/mlrc_cub200 --data-root /data"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("configs", nargs="+", help=CONFIGS_HELP)
        parser.add_argument(
            "--no-scan",
            action="store_true",
            help="do not open the image files (by default every image's header is read: an "
            "unreadable one is an error naming it; a progress bar from 1,000 images)",
        )
        add_methods(parser)
        add_common(parser)

    def run(self, args: argparse.Namespace) -> int:
        from ..experiment import check_configs
        from ..running import repeated_logs_once

        paths = [str(p) for p in config_paths(args.configs)]  # builds on --device or the CPU

        def devices(selected: dict) -> None:  # train's own device check: the two never disagree
            check_config_devices(args, selected)

        with (
            repeated_logs_once(),
            quiet_optuna(),
        ):  # "metric_loss has no parameters" once, with a count
            lines = load(
                check_configs,
                paths,
                args.overrides,
                methods(args),
                args.device,
                data_root(args),
                before=devices,
                scan=not args.no_scan,
            )
        for line in lines:
            print(line)
        return 0


@contextlib.contextmanager
def quiet_optuna():
    """Optuna's INFO lines ("A new study created in memory", one per search space dry run)
    silenced while ``check`` runs; its warnings still show."""
    import optuna

    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(before)
