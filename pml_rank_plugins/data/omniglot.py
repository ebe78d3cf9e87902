"""Omniglot (Lake et al., Science 2015) with two-level labels: category = alphabet."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path, PurePosixPath

import numpy as np
import torch
from PIL import Image


class OmniglotDataset(torch.utils.data.Dataset):
    """Reads ``<set>/<Alphabet>/character<NN>/*.png`` from a zip file or an extracted folder.

    Class = (alphabet, character) numbered in sorted order, category = alphabet in sorted order.
    Images are inverted (white strokes on black, as the glyphs), resized to ``image_size`` and kept
    in memory as uint8 (2,720 images of the small1 set: 2 MB at 28x28).

    Args:
        path: the ``.zip`` or the folder holding ``<set>/`` (or the ``<set>`` folder itself).
        image_size: side of the square output images.
        transform: optional callable on the ``PIL.Image``; default: float tensor (1, H, W) in [0, 1].

    Raises ``FileNotFoundError`` for a missing path and ``ValueError`` for a layout with no images.
    """

    def __init__(self, path: str | os.PathLike, image_size: int = 28, transform=None):
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"Omniglot not found at {path}")
        self.path, self.transform = path, transform
        entries = _zip_entries(path) if path.is_file() else _folder_entries(path)
        if not entries:
            raise ValueError(f"no images in {path}: expected <set>/<Alphabet>/character<NN>/*.png")
        entries.sort(key=lambda e: (e[0], e[1], e[2]))
        self.category_names = sorted({alphabet for alphabet, _, _, _ in entries})
        class_keys = sorted({(alphabet, char) for alphabet, char, _, _ in entries})
        self.class_names = [f"{alphabet}/{char}" for alphabet, char in class_keys]
        class_index = {key: i for i, key in enumerate(class_keys)}
        category_index = {name: i for i, name in enumerate(self.category_names)}
        self.labels = np.array(
            [(class_index[a, c], category_index[a]) for a, c, _, _ in entries], dtype=np.int64
        )
        self.images = np.stack([_load(read, image_size) for _, _, _, read in entries])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        image = self.images[index]
        if self.transform is not None:
            image = self.transform(Image.fromarray(image, mode="L"))
        else:
            image = torch.from_numpy(image).float().div_(255).unsqueeze(0)
        return image, torch.from_numpy(self.labels[index])


def _load(read, image_size: int) -> np.ndarray:
    with Image.open(io.BytesIO(read())) as image:
        image = image.convert("L").resize((image_size, image_size), Image.BILINEAR)
        return 255 - np.asarray(image, dtype=np.uint8)


def _zip_entries(path: Path):
    archive = zipfile.ZipFile(path)
    entries = []
    for name in archive.namelist():
        parts = PurePosixPath(name).parts
        if name.lower().endswith(".png") and len(parts) >= 3:
            entries.append((parts[-3], parts[-2], name, lambda n=name: archive.read(n)))
    return entries


def _folder_entries(path: Path):
    entries = []
    for file in path.rglob("*.png"):
        rel = file.relative_to(path).parts
        if len(rel) >= 3:
            entries.append((rel[-3], rel[-2], str(file), file.read_bytes))
    return entries
