"""``pml-rank study``: equal-budget tuning, then the tuned settings on K splits x S seeds -> one
report with the per-split and pooled verdicts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .base import Command, collect_one_config
from .options import (
    CONFIG_HELP,
    add_common,
    add_compile,
    add_methods,
    add_resume,
    add_stats,
)

__all__ = ["Study"]


class Study(Command):
    """Tune every selected method of CONFIG with ``--trials`` trials, retrain the tuned settings
    on ``--seeds`` seeds on each of ``--splits`` class-disjoint splits, and write ``study.md``
    (printed). The plan and every method are checked before anything trains. Exit status 1 when
    a run failed (the report is written from the others)."""

    name = "study"
    help = (
        "is any method better than the reference, fairly? tune every method, retrain on K class "
        "splits x S seeds, pool the verdicts, e.g. pml-rank study tune_demo --splits 3 --seeds 3"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("config", help=CONFIG_HELP)
        parser.add_argument("--out", default="runs/study", help="output folder, e.g. runs/mine")
        add_methods(parser)
        parser.add_argument(
            "--trials",
            type=int,
            default=None,
            metavar="N",
            help="Optuna trials per method, the same for every method (default: the config's "
            "tune.trials), e.g. --trials 20",
        )
        parser.add_argument(
            "--seeds", type=int, default=3, help="paired seeds per split (default 3), e.g. 5"
        )
        parser.add_argument(
            "--splits",
            type=int,
            default=2,
            metavar="K",
            help="class-disjoint splits (the config's, then its split seed + 1, + 2, ...; "
            "default 2), e.g. --splits 4",
        )
        add_resume(
            parser,
            "continue a killed study: finished trials and runs are kept, interrupted ones "
            "continued; only --seeds and --splits may change",
            overwrite=False,
        )
        add_stats(parser, "method")
        parser.add_argument(
            "--no-pictures",
            action="store_true",
            help="draw no retrieval pictures in the split folders",
        )
        add_compile(parser)
        add_common(parser)

    def run(self, args: argparse.Namespace) -> int:
        from ..reporting import run_study

        configs, names, root = collect_one_config(args)  # --compile: the first --set
        report = run_study(
            configs,  # the collected specs: validated once, not read again
            args.out,
            trials=args.trials,
            seeds=args.seeds,
            splits=args.splits,
            jobs=args.jobs,
            device=args.device,
            resume=args.resume,
            overrides=args.overrides,
            data_root=root,
            reference=args.reference,
            pictures=not args.no_pictures,
        )
        print((Path(args.out) / "study.md").read_text(), end="")
        failed = report["failed_runs"]
        if failed:
            print(f"pml-rank: {failed} run(s) failed; see study.md", file=sys.stderr)
        return 1 if failed else 0
