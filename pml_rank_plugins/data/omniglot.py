"""OmniglotDataset: the standard Omniglot layout, read from a zip or an extracted folder."""

from __future__ import annotations

import zipfile
from pathlib import Path, PurePosixPath
from typing import Callable

import numpy as np
from PIL import Image, ImageOps

from .images import DatasetFormatError, InMemoryImageDataset, load_image


class OmniglotDataset(InMemoryImageDataset):
    """Omniglot characters: category = alphabet, class = character (alphabet x characterNN).

    Reads every ``<Alphabet>/characterNN/*.png`` below ``path`` -- a ``.zip`` (as published,
    e.g. ``images_background.zip``) or an extracted folder, with or without the
    ``<set>/`` level above the alphabets (several sets may sit side by side). Alphabets and
    characters are numbered in sorted name order. Images are decoded once, resized to
    ``image_size`` (bilinear, antialiased) and kept in memory as uint8: O(N image_size^2) bytes.

    Args:
        path: zip file or folder.
        image_size: side of the square output images.
        transform: callable applied to the PIL image (mode ``"L"``); default converts it to a float
            tensor ``(1, S, S)`` in [0, 1].
        invert: if True (default), strokes are bright on a dark background (1 = ink), like
            :class:`~pml_rank_plugins.data.GlyphDataset`; Omniglot's PNGs are black on white.

    Attributes:
        images: uint8 ``(N, S, S)`` array, ``S = image_size``.
        labels: int64 ``(N, 2)`` array: ``[:, 0]`` the character (class), ``[:, 1]`` the alphabet
            (category).
        class_names: ``"Alphabet/characterNN"`` per class id.
        category_names: the alphabet per category id.
        paths: each image's zip member or file name, in row order.
    """

    def __init__(
        self,
        path: str | Path,
        image_size: int = 28,
        transform: Callable | None = None,
        invert: bool = True,
    ):
        self.path = Path(path)
        self.image_size = int(image_size)
        self.transform = transform
        self.invert = bool(invert)
        if self.path.is_file() and zipfile.is_zipfile(self.path):
            with zipfile.ZipFile(self.path) as archive:
                names = [n for n in archive.namelist() if n.lower().endswith(".png")]
                entries = self._index(names)
                images = [
                    self._decode(archive.read(name), invert, f"{self.path}: member {name}")
                    for name, _, _ in entries
                ]
        elif self.path.is_dir():
            names = [p.relative_to(self.path).as_posix() for p in self.path.rglob("*.png")]
            entries = self._index(names)
            images = [self._decode(self.path / name, invert) for name, _, _ in entries]
        elif self.path.exists():
            raise DatasetFormatError(f"{self.path}: not a zip file or a folder")
        else:
            raise DatasetFormatError(
                f"{self.path}: Omniglot data not found (expected a .zip or a folder)"
            )
        alphabets = sorted({alphabet for _, alphabet, _ in entries})
        characters = sorted({(alphabet, char) for _, alphabet, char in entries})
        char_ids = {key: i for i, key in enumerate(characters)}
        alphabet_ids = {name: i for i, name in enumerate(alphabets)}
        self.paths = [name for name, _, _ in entries]
        self.images = (
            np.stack(images) if images else np.zeros((0, image_size, image_size), np.uint8)
        )
        self.labels = np.array(
            [(char_ids[(a, c)], alphabet_ids[a]) for _, a, c in entries], dtype=np.int64
        ).reshape(-1, 2)
        self.class_names = [f"{a}/{c}" for a, c in characters]
        self.category_names = alphabets

    def _index(self, names: list[str]) -> list[tuple[str, str, str]]:
        """``(name, alphabet, character)`` per png, sorted by name; layout errors name the file."""
        entries = []
        for name in sorted(names):
            parts = PurePosixPath(name).parts
            if parts and parts[0] == "__MACOSX":
                continue
            if len(parts) < 3 or not parts[-2].startswith("character"):
                raise DatasetFormatError(
                    f"{self.path}: {name!r} is not in the Omniglot layout "
                    "<set>/<Alphabet>/characterNN/<image>.png"
                )
            entries.append((name, parts[-3], parts[-2]))
        if not entries:
            raise DatasetFormatError(f"{self.path}: no Omniglot .png images found")
        return entries

    def _decode(self, source: bytes | Path, invert: bool, name: str | None = None) -> np.ndarray:
        return np.asarray(self._prepare(load_image(source, "L", name), invert), dtype=np.uint8)

    def _prepare(self, image: Image.Image, invert: bool) -> Image.Image:
        if image.mode != "L":
            image = image.convert("L")
        if image.size != (self.image_size, self.image_size):
            image = image.resize((self.image_size, self.image_size), Image.Resampling.BILINEAR)
        return ImageOps.invert(image) if invert else image

    def prepare_image(self, image: Image.Image) -> Image.Image:
        """An image file's PIL image as this dataset stores its images (what ``transform`` sees):
        grayscale, resized to ``image_size`` (bilinear), inverted when the dataset was built with
        ``invert``. ``pml-rank embed --images`` applies it before the run's ``transforms.eval``."""
        return self._prepare(image, self.invert)
