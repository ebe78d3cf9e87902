"""GlyphDataset: the embedded default dataset, rendered from the fonts matplotlib ships.

No download: each class is one character, rendered from the DejaVu faces in matplotlib's font
folder; its category is the Unicode block (Latin upper, Greek lower, arrows, ...). Instances
cycle through the faces that have the glyph, each with a random affine transform (rotation,
scale, shear, shift), stroke width and pixel noise. Images are 32x32 grayscale (configurable).

The rendered images are cached as ``.npz`` under ``root`` (default ``$PML_RANK_CACHE`` or
``~/.cache/pml_rank_plugins``), in a file named by a hash of every parameter and of the list of
font files; the file is written atomically, so concurrent builds are safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import matplotlib
import numpy as np
import torch
from matplotlib.ft2font import FT2Font
from PIL import Image, ImageDraw, ImageFont

FORMAT_VERSION = 1

# (category name, first code point, last code point, at most this many classes)
BLOCKS = [
    ("digits", 0x30, 0x39, 10),
    ("Latin upper", 0x41, 0x5A, 26),
    ("Latin lower", 0x61, 0x7A, 26),
    ("Greek upper", 0x391, 0x3A9, 30),
    ("Greek lower", 0x3B1, 0x3C9, 30),
    ("Cyrillic upper", 0x410, 0x42F, 32),
    ("Cyrillic lower", 0x430, 0x44F, 32),
    ("letterlike symbols", 0x2100, 0x214F, 30),
    ("arrows", 0x2190, 0x21FF, 40),
    ("math operators", 0x2200, 0x22FF, 40),
    ("geometric shapes", 0x25A0, 0x25FF, 40),
]
MIN_FACES = 4  # a character needs this many font faces to give varied instances


def default_cache_dir() -> Path:
    return Path(os.environ.get("PML_RANK_CACHE", Path.home() / ".cache" / "pml_rank_plugins"))


def font_files() -> list[Path]:
    """The DejaVu faces shipped with matplotlib (Display faces excluded: few glyphs)."""
    folder = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    files = sorted(p for p in folder.glob("DejaVu*.ttf") if "Display" not in p.name)
    if not files:
        raise FileNotFoundError(f"no DejaVu fonts found in {folder}")
    return files


class GlyphDataset(torch.utils.data.Dataset):
    """Rendered Unicode glyphs with two-level labels [class = character, category = block].

    Args:
        root: cache folder (default ``$PML_RANK_CACHE`` or ``~/.cache/pml_rank_plugins``).
        seed: seed of the random augmentations (same seed -> identical images).
        images_per_class: instances per character.
        image_size: side of the square grayscale images.
        max_classes_per_category: cap on characters per Unicode block (``None``: the table's caps).
        transform: optional callable on the ``PIL.Image`` (mode "L"); default returns a float
            tensor ``(1, H, W)`` in [0, 1].

    Attributes: ``images`` (N, H, W) uint8, ``labels`` (N, 2) int64 [class, category],
    ``class_names`` (the characters), ``category_names``, ``cache_path``.
    Items: ``(image, label)`` with ``label`` the int64 tensor ``[class, category]``.
    """

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        seed: int = 0,
        images_per_class: int = 20,
        image_size: int = 32,
        max_classes_per_category: int | None = None,
        transform=None,
    ):
        if images_per_class < 2:
            raise ValueError(f"images_per_class must be >= 2, got {images_per_class}")
        if image_size < 8:
            raise ValueError(f"image_size must be >= 8, got {image_size}")
        self.transform = transform
        fonts = font_files()
        params = dict(
            version=FORMAT_VERSION,
            seed=int(seed),
            images_per_class=int(images_per_class),
            image_size=int(image_size),
            max_classes_per_category=max_classes_per_category,
            fonts=[p.name for p in fonts],
            blocks=BLOCKS,
        )
        key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
        self.cache_path = Path(root or default_cache_dir()) / f"glyphs-{key}.npz"
        if self.cache_path.exists():
            with np.load(self.cache_path) as data:
                images, labels = data["images"], data["labels"]
                class_names, category_names = list(data["class_names"]), list(
                    data["category_names"]
                )
        else:
            images, labels, class_names, category_names = render_glyphs(
                fonts, seed, images_per_class, image_size, max_classes_per_category
            )
            _save_atomically(
                self.cache_path,
                images=images,
                labels=labels,
                class_names=np.array(class_names),
                category_names=np.array(category_names),
            )
        self.images, self.labels = images, labels
        self.class_names = [str(c) for c in class_names]
        self.category_names = [str(c) for c in category_names]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        image = self.images[index]
        if self.transform is not None:
            image = self.transform(Image.fromarray(image, mode="L"))
        else:
            image = torch.from_numpy(image).float().div_(255).unsqueeze(0)
        return image, torch.from_numpy(self.labels[index])


def available_characters(fonts: list[Path], max_classes_per_category: int | None):
    """Per block, the characters present in at least ``MIN_FACES`` faces, with those faces."""
    charmaps = [set(FT2Font(str(path)).get_charmap()) for path in fonts]
    chosen = []
    for name, first, last, cap in BLOCKS:
        if max_classes_per_category is not None:
            cap = min(cap, max_classes_per_category)
        picked = []
        for code in range(first, last + 1):
            faces = [i for i, charmap in enumerate(charmaps) if code in charmap]
            if len(faces) >= MIN_FACES:
                picked.append((chr(code), faces))
        chosen.append((name, picked[:cap]))
    return chosen


def render_glyphs(fonts, seed, images_per_class, image_size, max_classes_per_category):
    """Render every (character, instance): returns images, labels, class and category names.

    O(classes * images_per_class) PIL renders of a 2x-sized canvas; each instance has its own
    generator derived from ``(seed, class, instance)``, so images do not depend on order.
    """
    canvas = 2 * image_size
    loaded = {}
    images, labels, class_names, category_names = [], [], [], []
    for category, (name, picked) in enumerate(
        (n, p) for n, p in available_characters(fonts, max_classes_per_category) if p
    ):
        category_names.append(name)
        for char, faces in picked:
            cls = len(class_names)
            class_names.append(char)
            for instance in range(images_per_class):
                rng = np.random.default_rng([seed, cls, instance])
                face = faces[(instance + cls) % len(faces)]
                size = int(canvas * rng.uniform(0.45, 0.6))
                if (face, size) not in loaded:
                    loaded[face, size] = ImageFont.truetype(str(fonts[face]), size)
                images.append(_render(char, loaded[face, size], canvas, image_size, rng))
                labels.append((cls, category))
    return (
        np.stack(images),
        np.array(labels, dtype=np.int64),
        class_names,
        category_names,
    )


def _render(char, font, canvas, image_size, rng) -> np.ndarray:
    image = Image.new("L", (canvas, canvas), 0)
    draw = ImageDraw.Draw(image)
    stroke = int(rng.integers(0, 2))
    left, top, right, bottom = draw.textbbox((0, 0), char, font=font, stroke_width=stroke)
    origin = ((canvas - (right - left)) / 2 - left, (canvas - (bottom - top)) / 2 - top)
    draw.text(origin, char, fill=255, font=font, stroke_width=stroke)
    # Random affine about the centre: rotation, anisotropic scale, shear, shift.
    angle = np.deg2rad(rng.uniform(-15, 15))
    sx, sy = rng.uniform(0.85, 1.15, size=2)
    shear = rng.uniform(-0.2, 0.2)
    shift = rng.uniform(-0.06, 0.06, size=2) * canvas
    cos, sin = np.cos(angle), np.sin(angle)
    forward = np.array([[cos, -sin], [sin, cos]]) @ np.array([[sx, shear], [0, sy]])
    inverse = np.linalg.inv(forward)
    centre = np.array([canvas / 2, canvas / 2])
    offset = centre - inverse @ (centre + shift)
    coeffs = (*inverse[0], offset[0], *inverse[1], offset[1])
    image = image.transform(image.size, Image.AFFINE, coeffs, resample=Image.BILINEAR)
    image = image.resize((image_size, image_size), Image.BILINEAR)
    pixels = np.asarray(image, dtype=np.float32) + rng.normal(0, 12, (image_size, image_size))
    return np.clip(pixels, 0, 255).astype(np.uint8)


def _save_atomically(path: Path, **arrays) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
