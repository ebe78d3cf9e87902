"""Shared image plumbing for every dataset: PIL -> tensor conversion and the lazy image-list base.

Every dataset in :mod:`pml_rank_plugins.data` returns ``(image, label)`` where ``image`` is a float
tensor ``(C, H, W)`` -- the ``transform`` output if one is given, else the PIL image converted by
:func:`to_float_tensor` -- and ``label`` is the length-2 int64 tensor ``[class, category]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from .labels import as_two_level


class DatasetFormatError(ValueError):
    """An annotation file is missing or malformed; the message names the file (and line)."""


def format_error(path: Path, line_no: int | None, problem: str) -> DatasetFormatError:
    """Build a :class:`DatasetFormatError` naming ``path`` and the 1-based ``line_no``."""
    where = f"{path}" if line_no is None else f"{path}, line {line_no}"
    return DatasetFormatError(f"{where}: {problem}")


def require_file(path: Path, what: str = "annotation file") -> Path:
    """Return ``path`` if it is a file, else raise :class:`DatasetFormatError` naming it."""
    path = Path(path)
    if not path.is_file():
        raise DatasetFormatError(f"{path}: {what} not found")
    return path


def read_rows(
    path: Path, num_fields: int, skip: int = 0, what: str = "annotation file"
) -> list[tuple[int, list[str]]]:
    """Whitespace-split rows of a text annotation file, with their 1-based line numbers.

    The first ``skip`` lines (headers) are dropped, blank lines are ignored, and every other line
    must have exactly ``num_fields`` fields, else :class:`DatasetFormatError` names file and line.
    """
    path = require_file(path, what)
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if line_no <= skip or not line.strip():
                continue
            fields = line.split()
            if len(fields) != num_fields:
                raise format_error(
                    path, line_no, f"expected {num_fields} fields, got {len(fields)}: {line!r}"
                )
            rows.append((line_no, fields))
    return rows


def parse_int(path: Path, line_no: int, text: str, what: str) -> int:
    """``int(text)``, or a :class:`DatasetFormatError` naming file, line and field."""
    try:
        return int(text)
    except ValueError:
        raise format_error(path, line_no, f"{what} is not an integer: {text!r}") from None


def to_float_tensor(image: Image.Image) -> torch.Tensor:
    """PIL image -> float32 tensor ``(C, H, W)`` in [0, 1] (same as torchvision's ``to_tensor``)."""
    array = np.array(image, dtype=np.uint8)  # a copy: PIL's buffer is read-only
    if array.ndim == 2:
        array = array[None]
    else:
        array = array.transpose(2, 0, 1)
    return torch.from_numpy(np.ascontiguousarray(array)).float().div_(255.0)


def label_tensor(labels: np.ndarray, index: int) -> torch.Tensor:
    """Row ``index`` of the ``(N, 2)`` labels as an int64 tensor ``[class, category]``."""
    return torch.from_numpy(labels[index].copy())


class InMemoryImageDataset(Dataset):
    """Base for datasets held as a uint8 array ``images`` ``(N, H, W)`` with ``labels`` ``(N, 2)``
    and an optional ``transform`` on the PIL image (else a float tensor ``(1, H, W)`` in [0, 1])."""

    images: np.ndarray
    labels: np.ndarray
    transform: Callable | None

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.transform is None:
            image = torch.from_numpy(self.images[index]).float().div_(255.0)[None]
        else:
            image = self.transform(Image.fromarray(self.images[index]))
        return image, label_tensor(self.labels, index)


class ImageListDataset(Dataset):
    """Images listed by path, loaded lazily with PIL on ``__getitem__``.

    Args:
        paths: image paths, one per item (absolute, or relative to ``root``).
        labels: ``(N, 2)`` two-level labels (see :mod:`pml_rank_plugins.data.labels`).
        root: directory that relative ``paths`` start from.
        transform: callable applied to the PIL image; default :func:`to_float_tensor`.
        mode: PIL mode the image is converted to (``"RGB"`` or ``"L"``).
    """

    def __init__(
        self,
        paths: Sequence[str | Path],
        labels,
        root: str | Path | None = None,
        transform: Callable | None = None,
        mode: str = "RGB",
    ):
        self.root = Path(root) if root is not None else None
        self.paths = [Path(p) for p in paths]
        self.labels = as_two_level(labels) if len(self.paths) else np.zeros((0, 2), np.int64)
        if len(self.labels) != len(self.paths):
            raise ValueError(f"{len(self.paths)} paths but {len(self.labels)} labels")
        self.transform = transform
        self.mode = mode

    def __len__(self) -> int:
        return len(self.paths)

    def image_path(self, index: int) -> Path:
        path = self.paths[index]
        return self.root / path if self.root is not None else path

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        with Image.open(self.image_path(index)) as raw:
            image = raw.convert(self.mode)
        image = self.transform(image) if self.transform is not None else to_float_tensor(image)
        return image, label_tensor(self.labels, index)
