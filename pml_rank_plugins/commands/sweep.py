"""``pml-rank sweep``: one method over a grid of overrides x seeds -> table, plots."""

from __future__ import annotations

import argparse

from .base import (
    Command,
    check_config_devices,
    config_paths,
    data_root,
    load,
    pick,
    report_failures,
)
from .compare import RUN_OPTIONS
from .options import CONFIG_HELP, add_common, add_resume, add_stats

__all__ = ["Sweep"]


class Sweep(Command):
    """Train ``--method`` of CONFIG at every cell of the ``--grid`` product on ``--seeds`` seeds;
    write and print the table (the grid is validated before the first run)."""

    name = "sweep"
    help = (
        "one method over a grid of overrides x seeds -> table, plots, e.g. "
        'pml-rank sweep default --method "plugin FastAP" --grid trainer.batch_size=32,64'
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("config", help=CONFIG_HELP)
        parser.add_argument(
            "--method",
            default=None,
            help='the config\'s method to sweep (needed when it has several), e.g. "plugin FastAP"',
        )
        parser.add_argument(
            "--grid",
            action="append",
            default=[],
            required=True,
            metavar="KEY=V1,V2,...",
            help="a config key and its values (YAML, like --set); repeat for a Cartesian grid, e.g."
            " --grid loss_funcs.metric_loss.num_bins=5,10,20 --grid trainer.batch_size=32,64",
        )
        parser.add_argument(
            "--seeds", type=int, default=1, help="seeds per cell (the same for every cell), e.g. 3"
        )
        parser.add_argument("--out", default="runs/sweep", help="output folder, e.g. runs/bins")
        add_resume(parser, "skip finished runs, continue interrupted ones")
        add_stats(parser, "cell")
        add_common(parser)

    def run(self, args: argparse.Namespace) -> int:
        from ..reporting import markdown_table, prepare_sweep, run_sweep
        from ..running import is_main_process

        (path,) = config_paths([args.config])
        root = data_root(args)
        prepared = load(
            prepare_sweep, path, args.method, args.grid, args.overrides, args.reference, root
        )
        check_config_devices(args, prepared[3])  # every cell's device, as train checks it
        summary = run_sweep(
            path,
            args.method,
            args.grid,
            args.out,
            data_root=root,
            prepared=prepared,
            **pick(args, RUN_OPTIONS),
        )
        if is_main_process():  # torchrun: one report, from rank 0
            print(markdown_table(summary, "cell"))
            print(f"total wall time: {summary['total_wall_seconds']:.1f} s; outputs in {args.out}")
        return report_failures(summary)
