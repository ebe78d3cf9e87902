"""Shared image plumbing for every dataset: PIL -> tensor conversion and the lazy image-list base.

Every dataset in :mod:`pml_rank_plugins.data` returns ``(image, label)`` where ``image`` is a float
tensor ``(C, H, W)`` -- the ``transform`` output if one is given, else the PIL image converted by
:func:`to_float_tensor` -- and ``label`` is the length-2 int64 tensor ``[class, category]``.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Callable, Hashable, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from .labels import as_two_level

# The file suffixes read as images (any case): by ImageFolderDataset and by ``embed --images``.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")


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
    for line_no, line in read_lines(path):
        if line_no <= skip or not line.strip():
            continue
        fields = line.split()
        if len(fields) != num_fields:
            raise format_error(
                path, line_no, f"expected {num_fields} fields, got {len(fields)}: {line!r}"
            )
        rows.append((line_no, fields))
    return rows


def read_lines(path: Path) -> list[tuple[int, str]]:
    """``(1-based line number, text)`` of every line of a UTF-8 text file.

    Decodes line by line so that a byte sequence that is not UTF-8 is reported with its line
    (:class:`DatasetFormatError`) instead of a bare ``UnicodeDecodeError``.
    """
    lines = []
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                lines.append((line_no, raw.decode("utf-8")))
            except UnicodeDecodeError as err:
                raise format_error(
                    path,
                    line_no,
                    f"not valid UTF-8 (byte {raw[err.start:err.start + 1]!r} at column "
                    f"{err.start + 1}); re-save the file as UTF-8",
                ) from None
    return lines


def require_nonempty(path: Path, count: int, what: str = "no entries") -> None:
    """Raise :class:`DatasetFormatError` naming ``path`` when ``count`` is 0 (an empty file or an
    empty selection would otherwise give an empty dataset silently)."""
    if count == 0:
        raise DatasetFormatError(f"{path}: {what}")


class FirstLine:
    """Remembers the line where each key (an image path, an id) first appeared.

    ``add(path, line_no, key, what)`` raises :class:`DatasetFormatError` naming both lines when
    ``key`` was seen before: an image listed twice is refused whatever labels the two lines give
    (with different labels, "last one wins" would silently pick one). O(1) per call.
    """

    def __init__(self) -> None:
        self.lines: dict[Hashable, int] = {}

    def add(self, path: Path, line_no: int, key: Hashable, what: str) -> None:
        first = self.lines.setdefault(key, line_no)
        if first != line_no:
            raise format_error(path, line_no, f"{what} is already listed at line {first}")


class CategoryTracker:
    """Checks, line by line, that every item of a class has the same category.

    ``add(path, line_no, cls, category)`` remembers the first line of each class and raises
    :class:`DatasetFormatError` naming both lines when a later line puts the class under another
    category. O(1) per call.
    """

    def __init__(self, class_name: str = "class"):
        self.class_name = class_name
        self.first: dict[int, tuple[Hashable, Path, int]] = {}

    def add(self, path: Path, line_no: int, cls: int, category: Hashable) -> None:
        known = self.first.setdefault(cls, (category, path, line_no))
        if known[0] != category:
            where = f"line {known[2]}" if known[1] == path else f"{known[1]}, line {known[2]}"
            raise format_error(
                path,
                line_no,
                f"{self.class_name} {cls} is under category {category!r} here but under "
                f"category {known[0]!r} at {where}; every item of a class must share its category",
            )


_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


def load_image(source: str | Path | bytes, mode: str, name: str | None = None) -> Image.Image:
    """Open and fully decode an image (a file path, or the bytes of an archive member) with PIL,
    converted to ``mode``.

    Any failure -- a missing file, bytes PIL cannot identify, a truncated or corrupt file --
    raises :class:`DatasetFormatError` whose message starts with ``name`` (default: the path),
    e.g. ``"data.zip: member a/b.png: cannot identify image file"``, never PIL's
    ``<_io.BytesIO object>``.
    """
    if name is None:
        if isinstance(source, bytes):
            raise TypeError("load_image needs a name for image bytes")
        name = str(source)
    try:
        if isinstance(source, bytes):
            handle = io.BytesIO(source)
        elif not Path(source).is_file():
            raise DatasetFormatError(f"{name}: image file not found")
        else:
            handle = source
        with Image.open(handle) as raw:
            return raw.convert(mode)  # convert() forces the full decode: truncation shows here
    except DatasetFormatError:
        raise
    except Image.UnidentifiedImageError:
        raise DatasetFormatError(
            f"{name}: cannot identify image file (not an image PIL can read, or empty)"
        ) from None
    except _DECODE_ERRORS as err:
        raise DatasetFormatError(f"{name}: cannot decode image ({err})") from err


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

    def prepare_image(self, image: Image.Image) -> Image.Image:
        """An image file's PIL image as this dataset stores its images (what ``transform`` sees):
        grayscale (``"L"``), resized (bilinear) to the stored ``(H, W)``. ``pml-rank embed
        --images`` applies it before the run's ``transforms.eval``, so one's own files reach the
        model as the dataset's images did."""
        image = image if image.mode == "L" else image.convert("L")
        height, width = self.images.shape[1:3]
        if image.size != (width, height):
            image = image.resize((width, height), Image.Resampling.BILINEAR)
        return image

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
        labels: ``(N, 2)`` two-level labels (see :func:`~pml_rank_plugins.data.as_two_level`).
        root: directory that relative ``paths`` start from.
        transform: callable applied to the PIL image; default :func:`~.images.to_float_tensor`.
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

    def load(self, index: int) -> Image.Image:
        """The PIL image of item ``index`` (errors name the file: :func:`~.images.load_image`)."""
        return load_image(self.image_path(index), self.mode)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.load(index)
        image = self.transform(image) if self.transform is not None else to_float_tensor(image)
        return image, label_tensor(self.labels, index)

    def scan(self, progress: Callable[[int, int], None] | None = None) -> list[tuple[str, str]]:
        """``(path, reason)`` of every listed image whose header PIL cannot read, in item order
        (``[]`` when all open), for ``pml-rank check``: a missing file, bytes PIL cannot
        identify, a header it cannot parse. ``Image.open`` reads the format and size, not the
        pixels, so a file truncated after its header is found only when decoded.
        ``progress(done, total)`` is called after each file (a progress bar on large sets).
        Cost: one ``open`` and a few hundred bytes read per image, O(N)."""
        problems = []
        total = len(self)
        for index in range(total):
            path = self.image_path(index)
            reason = header_problem(path)
            if reason is not None:
                problems.append((str(path), reason))
            if progress is not None:
                progress(index + 1, total)
        return problems


def header_problem(path: Path) -> str | None:
    """Why PIL cannot read the image header of ``path``, or None when it can."""
    if not Path(path).is_file():
        return "image file not found"
    try:
        with Image.open(path) as image:
            image.size  # noqa: B018 -- open() parses the header; reading .size proves it did
    except Image.UnidentifiedImageError:
        return "cannot identify image file (not an image PIL can read, or empty)"
    except _DECODE_ERRORS as err:
        return f"cannot read the image header ({err})"
    return None
