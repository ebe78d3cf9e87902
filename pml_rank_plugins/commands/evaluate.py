"""``pml-rank eval``: evaluate a run folder's best (or latest) checkpoint."""

from __future__ import annotations

import argparse
import json

from .base import Command, data_root
from .options import RUN_DIR_HELP, add_data_root, add_device, add_which

__all__ = ["Eval"]


class Eval(Command):
    """Evaluate RUN_DIR's checkpoint on its config's splits; print the metrics as JSON."""

    name = "eval"
    help = "evaluate a run folder's best (or latest) checkpoint, e.g. pml-rank eval runs/x"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", help=RUN_DIR_HELP)
        add_which(parser, "evaluate")
        add_device(parser)
        add_data_root(parser)

    def run(self, args: argparse.Namespace) -> int:
        from ..running import evaluate, refuse_under_torchrun

        refuse_under_torchrun("eval")
        root = data_root(args, env=False)  # the saved config's data_root unless given
        out = evaluate(args.run_dir, args.which, args.device, data_root=root)
        print(json.dumps(out, indent=2))
        return 0
