"""``pml-rank tune``: tune every method's search space with the same budget (Optuna)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .base import Command, collect_one_config
from .options import CONFIG_HELP, add_common, add_compile, add_methods

__all__ = ["Tune"]


class Tune(Command):
    """Run ``--trials`` Optuna trials per method of CONFIG; print ``tune.md``. Exit status 1
    when a method has no complete trial."""

    name = "tune"
    help = (
        "tune every method's search space with the same budget (Optuna), e.g. "
        "pml-rank tune tune_demo --out runs/tune"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("config", help=CONFIG_HELP)
        parser.add_argument(
            "--out", default="runs/tune", help="output folder, e.g. --out runs/tune"
        )
        add_methods(parser)
        parser.add_argument(
            "--trials",
            type=int,
            default=None,
            metavar="N",
            help="trials per method (default: the config's tune.trials), e.g. --trials 20; "
            "rerunning continues the study up to N",
        )
        parser.add_argument(
            "--storage",
            default=None,
            metavar="URL",
            help="Optuna storage shared by workers and machines, e.g. --storage "
            "postgresql://user@host/db (default sqlite:///OUT/tune.db)",
        )
        parser.add_argument(
            "--jobs",
            type=int,
            default=1,
            metavar="K",
            help="K worker processes on each study, e.g. --jobs 2",
        )
        add_common(parser)
        add_compile(parser)

    def run(self, args: argparse.Namespace) -> int:
        from ..reporting import run_tune

        configs, names, root = collect_one_config(args)  # --compile: the first --set
        summary = run_tune(
            configs,  # the collected specs: validated once, not read again
            args.out,
            trials=args.trials,
            storage=args.storage,
            jobs=args.jobs,
            device=args.device,
            overrides=args.overrides,
            methods=names,
            data_root=root,
        )
        print((Path(args.out) / "tune.md").read_text(), end="")
        stopped = sum(s.get("n_interrupted", 0) for s in summary["methods"].values())
        failed = sum(s["states"].get("fail", 0) for s in summary["methods"].values()) - stopped
        print(
            f"outputs in {args.out}; {failed} failed trial(s), {stopped} interrupted (not counted)"
        )
        empty = [m for m, s in summary["methods"].items() if s["best_params"] is None]
        if empty:
            print(f"pml-rank: no complete trial for {empty}; see tune.md", file=sys.stderr)
            return 1
        return 0
