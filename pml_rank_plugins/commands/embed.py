"""``pml-rank embed``: embed a split with a trained run's model into ``.npz``/``.npy``."""

from __future__ import annotations

import argparse
import json

from .base import BadArgument, Command, argument, data_root
from .options import RUN_DIR_HELP, add_data_root, add_device, add_which

__all__ = ["Embed"]


class Embed(Command):
    """Embed ``--split`` of RUN_DIR's config with its checkpoint and write ``--out``.

    A bad ``--out``, a folder that is no finished run or a split the config lacks is exit 2
    naming it, checked before anything is written.
    """

    name = "embed"
    help = (
        "embed a split with a trained run's model into .npz/.npy, e.g. "
        "pml-rank embed runs/fastap --split test --out test.npz"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", help=RUN_DIR_HELP)
        parser.add_argument(
            "--split", required=True, metavar="NAME", help="a split of the run's config, e.g. test"
        )
        parser.add_argument(
            "--out",
            required=True,
            metavar="FILE",
            help="FILE.npz (embeddings, labels, split, run_dir, checkpoint) or FILE.npy (and "
            "FILE_labels.npy), e.g. --out test.npz",
        )
        add_which(parser, "load")
        add_device(parser)
        add_data_root(parser)

    def run(self, args: argparse.Namespace) -> int:
        from ..running import (
            RunFolderError,
            embed,
            embeddings_files,
            load_run,
            refuse_under_torchrun,
            save_embeddings,
        )

        refuse_under_torchrun("embed")
        argument(embeddings_files, args.out)  # before the model is built: fails in a second
        root = data_root(args, env=False)  # the saved config's data_root unless given
        run = (args.run_dir, args.which, args.device, root)
        loaded = argument(load_run, *run, errors=(RunFolderError,))
        if args.split not in loaded.datasets:
            have = ", ".join(loaded.datasets)
            raise BadArgument(
                f"--split {args.split}: not in {args.run_dir}'s config; available: {have}"
            )
        embeddings, labels = embed(loaded, args.split)
        meta = {
            "split": args.split,
            "run_dir": str(args.run_dir),
            "checkpoint": str(loaded.checkpoint),
        }
        files = argument(save_embeddings, args.out, embeddings, labels, **meta)
        shape = list(embeddings.shape)
        print(json.dumps({"files": [str(f) for f in files], "shape": shape, **meta}))
        return 0
