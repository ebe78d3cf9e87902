"""``pml-rank compare``: methods x seeds -> table with 95% CIs, paired tests, plots."""

from __future__ import annotations

import argparse

from .base import (
    BadArgument,
    BadConfig,
    Command,
    check_config_devices,
    config_paths,
    data_root,
    load,
    methods,
    pick,
    report_failures,
)
from .options import (
    CONFIGS_HELP,
    add_common,
    add_compile,
    add_methods,
    add_resume,
    add_stats,
    compile_overrides,
)

__all__ = ["Compare", "RUN_OPTIONS"]

# The options compare and sweep hand to run_comparison / run_sweep unchanged.
RUN_OPTIONS = ("seeds", "overrides", "resume", "overwrite", "reference", "device", "jobs")


class Compare(Command):
    """Train every selected method of CONFIG... on ``--seeds`` seeds; write and print the table.

    The methods are collected, their devices checked and built once (``check_methods``) before the
    first run starts, so a config mistake costs seconds, not a training.
    """

    name = "compare"
    help = (
        "methods x seeds -> table with 95%% CIs, paired tests, plots, e.g. "
        "pml-rank compare default"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("configs", nargs="+", help=CONFIGS_HELP)
        parser.add_argument("--seeds", type=int, default=1, help="seeds per method, e.g. --seeds 3")
        parser.add_argument(
            "--out", default="runs/compare", help="output folder, e.g. --out runs/default"
        )
        add_methods(parser)
        add_resume(
            parser,
            "reuse finished runs, continue interrupted ones, retry failed ones and rewrite the"
            " tables (re-summarizes without retraining)",
        )
        add_stats(parser, "method")
        add_common(parser)
        add_compile(parser)
        parser.add_argument(
            "--tuned",
            default=None,
            metavar="DIR",
            help="retrain every method with the best parameters of a `pml-rank tune` run, at the "
            "budget it was tuned at, on fresh seeds, e.g. --tuned runs/tune",
        )
        parser.add_argument(
            "--allow-budget-change",
            action="store_true",
            help="with --tuned: let --set change the tuned budget (e.g. trainer.num_epochs); the "
            "change is recorded in summary.json",
        )
        parser.add_argument(
            "--no-pictures",
            action="store_true",
            help="draw no retrieval pictures (existing ones are kept)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from ..experiment import check_methods, collect_methods
        from ..reporting import markdown_table, run_comparison
        from ..running import is_main_process

        args.overrides = compile_overrides(args)  # --compile: the first --set
        if args.allow_budget_change and not args.tuned:
            raise BadArgument("--allow-budget-change applies only with --tuned DIR")
        names = methods(args)
        paths = config_paths(args.configs)
        root = data_root(args)
        configs = load(collect_methods, paths, args.overrides, names, root)
        check_config_devices(args, configs)
        if args.reference is not None and args.reference not in configs:
            raise BadConfig(f"--reference {args.reference!r}: not one of {list(configs)}")
        load(check_methods, configs)  # fail fast, before the first run
        summary = run_comparison(
            configs,  # the collected specs: validated once, not read again
            args.out,
            methods=names,
            data_root=root,
            tuned=args.tuned,
            allow_budget_change=args.allow_budget_change,
            pictures=not args.no_pictures,
            **pick(args, RUN_OPTIONS),
        )
        if is_main_process():  # torchrun: one report, from rank 0
            print(markdown_table(summary))
            print(f"total wall time: {summary['total_wall_seconds']:.1f} s; outputs in {args.out}")
        return report_failures(summary)
