"""``pml-rank embed``: embed a split, or a folder of one's own images, with a trained run's model
into ``.npz``/``.npy``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from .base import BadArgument, Command, argument, data_root
from .options import RUN_DIR_HELP, add_data_root, add_device, add_which

if TYPE_CHECKING:  # numpy (and the data package) load lazily: the CLI starts without them
    import numpy as np

__all__ = ["Embed"]


class Embed(Command):
    """Embed ``--split`` of RUN_DIR's config, or the image files under ``--images DIR``, with its
    checkpoint and write ``--out``.

    ``--images``: every file under DIR ending in .jpg/.jpeg/.png/.bmp/.gif/.tif/.tiff/.webp
    (recursively, sorted), loaded with the run's evaluation transform; ``--out`` (default
    ``embeddings.npz``, never overwritten unless named) gets ``embeddings`` and ``paths``
    (relative to DIR) and, when every image lies in a sub-folder (DIR/<class>/ or
    DIR/<category>/<class>/, as :class:`~pml_rank_plugins.data.ImageFolderDataset` reads it),
    ``labels`` (``(N,)`` ids) and ``class_names`` (the sub-folders, ``class_names[id]``).
    ``--split`` of a dataset that keeps names (``ImageFolderDataset``) also writes
    ``class_names`` and ``category_names`` next to the ``(N, 2)`` labels (``.npz`` only). A bad ``--out``, a folder that is no finished run, a split the config
    lacks, a folder without images or an unreadable image is exit 2 naming it, checked before
    anything is written.
    """

    name = "embed"
    help = (
        "embed a split with a trained run's model into .npz/.npy, e.g. "
        "pml-rank embed runs/fastap --split test --out test.npz, or "
        "pml-rank embed runs/fastap --images photos/ --out photos.npz"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", help=RUN_DIR_HELP)
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument(
            "--split", metavar="NAME", help="a split of the run's config, e.g. test"
        )
        source.add_argument(
            "--images",
            metavar="DIR",
            help="a folder of your own images (searched recursively), e.g. --images photos/",
        )
        parser.add_argument(
            "--out",
            metavar="FILE",
            help="FILE.npz (embeddings, labels or paths, and metadata) or, with --split, FILE.npy "
            "(and FILE_labels.npy), e.g. --out test.npz; required with --split; with --images "
            "default embeddings.npz (refused if it exists)",
        )
        add_which(parser, "load")
        add_device(parser)
        add_data_root(parser)

    def run(self, args: argparse.Namespace) -> int:
        from ..data import label_names
        from ..running import (
            RunFolderError,
            embed,
            embeddings_files,
            load_run,
            refuse_under_torchrun,
            save_embeddings,
        )

        refuse_under_torchrun("embed")
        if args.images is not None:
            return self._images(args)
        if args.out is None:
            raise BadArgument("--out FILE is required with --split, e.g. --out test.npz")
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
        classes, categories = label_names(loaded.datasets[args.split])  # None: integer ids only
        meta = {
            "split": args.split,
            "run_dir": str(args.run_dir),
            "checkpoint": str(loaded.checkpoint),
        }
        names = {"class_names": classes, "category_names": categories}
        files = argument(save_embeddings, args.out, embeddings, labels, **names, **meta)
        shape = list(embeddings.shape)
        print(json.dumps({"files": [str(f) for f in files], "shape": shape, **meta}))
        return 0

    def _images(self, args: argparse.Namespace) -> int:
        from ..running import (
            ImageFiles,
            RunFolderError,
            embed,
            embeddings_files,
            find_images,
            load_run,
            save_embeddings,
        )

        out = args.out
        if out is None:
            out = "embeddings.npz"
            if Path(out).exists():
                raise BadArgument(
                    f"--out: {out} exists; name the output file with --out to overwrite it"
                )
        if not str(out).endswith(".npz"):
            raise BadArgument(f"--out {out}: --images writes a .npz (embeddings and paths)")
        argument(embeddings_files, out)
        files = argument(find_images, args.images)
        root = data_root(args, env=False)
        run = (args.run_dir, args.which, args.device, root)
        loaded = argument(load_run, *run, errors=(RunFolderError,))
        dataset = ImageFiles(files, loaded.eval_transform)
        argument(dataset.check)  # an unreadable file: exit 2 naming it, nothing written
        embeddings = argument(embed, loaded, dataset)
        folder = Path(args.images)
        paths = [f.relative_to(folder).as_posix() for f in files]
        meta = {"images": str(folder), "run_dir": str(args.run_dir)}
        meta["checkpoint"] = str(loaded.checkpoint)
        labels, names = _folder_classes(paths)
        written = argument(
            save_embeddings, out, embeddings, labels, paths=paths, class_names=names, **meta
        )
        shape = list(embeddings.shape)
        print(json.dumps({"files": [str(f) for f in written], "shape": shape, **meta}))
        return 0


def _folder_classes(paths: list[str]) -> tuple[np.ndarray | None, list[str] | None]:
    """Each image's class as ImageFolderDataset names it: its folder relative to ``--images``
    (``cat`` for ``cat/1.jpg``, ``animals/cat`` for ``animals/cat/1.jpg``), encoded to ids in
    sorted order of the names; ``(None, None)`` when an image lies directly in the folder."""
    from ..data import encode_labels

    folders = [PurePosixPath(p).parent.as_posix() for p in paths]
    if "." in folders:
        return None, None
    codes, names = encode_labels(folders)
    return codes.numpy(), names
