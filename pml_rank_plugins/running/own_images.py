"""Embedding one's own images with a trained run: the image files of a folder, loaded with the
run's evaluation transform (``pml-rank embed RUN --images DIR``, :func:`image_dataset`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import PIL.Image
import torch

from ..data.images import IMAGE_SUFFIXES, DatasetFormatError, load_image, to_float_tensor


@dataclass(frozen=True)
class EvalTransform:
    """A PIL image -> the model's input, as the run's evaluation saw its images.

    ``mode``: the PIL mode the run's datasets load (``"L"`` grayscale, ``"RGB"``); ``steps``:
    the config's ``transforms.eval`` (``None``: the datasets' built-in conversion,
    :func:`~pml_rank_plugins.data.images.to_float_tensor`, a float ``(C, H, W)`` in [0, 1]);
    ``prepare``: the datasets' own decoding step before ``steps``, when they have one (their
    ``prepare_image``: e.g. ``OmniglotDataset`` resizes to its ``image_size`` and inverts).
    One call: ``steps(prepare(image.convert(mode)))``.
    """

    mode: str
    steps: Callable | None = None
    prepare: Callable[[PIL.Image.Image], PIL.Image.Image] | None = None

    def __call__(self, image: PIL.Image.Image) -> torch.Tensor:
        if image.mode != self.mode:
            image = image.convert(self.mode)
        if self.prepare is not None:
            image = self.prepare(image)
        return self.steps(image) if self.steps is not None else to_float_tensor(image)


def find_images(folder: str | Path) -> list[Path]:
    """The image files under ``folder``, recursively (suffixes ``IMAGE_SUFFIXES``: .jpg, .jpeg, .png,
    .bmp, .gif, .tif, .tiff, .webp, any case), sorted by their path relative to ``folder``.

    Raises:
        ValueError: ``folder`` is not a folder, or holds no image file (the message names it and
            the suffixes looked for).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"--images {folder}: not a folder")
    files = sorted(
        (p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()),
        key=lambda p: p.relative_to(folder).as_posix(),
    )
    if not files:
        raise ValueError(
            f"--images {folder}: no image files found (looked for {', '.join(IMAGE_SUFFIXES)}, "
            "recursively)"
        )
    return files


class ImageFiles(torch.utils.data.Dataset):
    """Unlabeled dataset of image files: item ``i`` is ``transform(PIL image of paths[i])``, a
    tensor (what :func:`~pml_rank_plugins.running.embed` takes as an unlabeled dataset).

    Unreadable files raise :class:`~pml_rank_plugins.data.DatasetFormatError` naming the
    file (:meth:`check` finds them all before any model runs).
    """

    def __init__(self, paths: list[Path], transform: Callable[[PIL.Image.Image], torch.Tensor]):
        self.paths = list(paths)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> torch.Tensor:
        mode = getattr(self.transform, "mode", "RGB")
        return self.transform(load_image(self.paths[index], mode))

    def check(self) -> None:
        """Open every file's header (not a full decode: O(files)); raises
        :class:`~pml_rank_plugins.data.DatasetFormatError` naming the first file PIL cannot identify.
        """
        for path in self.paths:
            try:
                with PIL.Image.open(path) as image:
                    image.verify()
            except Exception as err:  # PIL raises many types for a bad file
                raise DatasetFormatError(f"{path}: cannot read image ({err})") from err


def image_dataset(folder: str | Path, transform: Callable) -> ImageFiles:
    """:class:`ImageFiles` of :func:`find_images` ``(folder)``, checked (:meth:`ImageFiles.check`)."""
    dataset = ImageFiles(find_images(folder), transform)
    dataset.check()
    return dataset
