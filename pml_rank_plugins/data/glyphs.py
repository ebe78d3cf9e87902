"""GlyphDataset: the embedded default dataset, rendered from the DejaVu fonts matplotlib ships.

Class = one Unicode character, category = its script/block (Latin upper, Greek lower, arrows, ...),
instance = one rendering with a random DejaVu face (Sans/Serif/Mono x regular/bold/oblique), random
affine warp (rotation, shear, zoom, shift), random stroke width and Gaussian noise. Nothing is
downloaded; the rendered uint8 array is cached on disk in an ``.npz`` keyed by every parameter,
with a verification record (parameter key, sha256 of the arrays) checked with the arrays' shapes,
dtypes and class counts on every load; a cache that fails is rebuilt with one warning.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import tempfile
import warnings
import zipfile
import zlib
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import PIL
from PIL import Image, ImageDraw, ImageFont

from .images import InMemoryImageDataset

# Bump when the rendering or the cache layout changes, so old caches are never read for new
# parameters. 2: the verification record ("meta") was added.
GLYPH_CACHE_VERSION = 2

# The arrays of a cache file, besides its verification record "meta".
_ARRAYS = ("images", "labels", "class_names", "category_names")
# What np.load / zipfile / zlib raise on a damaged .npz (found by flipping every bit of a cache
# and cutting it at every byte); RuntimeError covers NotImplementedError (a flipped "encrypted"
# or compression flag), MemoryError a damaged npy header claiming a huge shape.
_READ_ERRORS = (OSError, EOFError, ValueError, KeyError, RuntimeError, MemoryError)
_READ_ERRORS += (zipfile.BadZipFile, zlib.error)


class GlyphCacheWarning(UserWarning):
    """A glyph cache file could not be used (unreadable, damaged or stale) and is rebuilt."""


class InvalidGlyphCache(Exception):
    """Why a cache file cannot be used; the message completes "glyph cache PATH is ..."."""


# (category name, inclusive code point ranges), in class-id order.
GLYPH_CATEGORIES: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = (
    ("latin_upper", ((0x41, 0x5A),)),
    ("latin_lower", ((0x61, 0x7A),)),
    ("digits", ((0x30, 0x39),)),
    ("greek_upper", ((0x391, 0x3A9),)),
    ("greek_lower", ((0x3B1, 0x3C9),)),
    ("cyrillic_upper", ((0x410, 0x42F),)),
    ("cyrillic_lower", ((0x430, 0x44F),)),
    ("armenian", ((0x531, 0x556),)),
    ("hebrew", ((0x5D0, 0x5EA),)),
    ("georgian", ((0x10D0, 0x10FA),)),
    ("arrows", ((0x2190, 0x21FF),)),
    ("math_operators", ((0x2200, 0x22FF),)),
    ("geometric_shapes", ((0x25A0, 0x25FF),)),
)

# The 12 text faces; the two "Display" fonts hold only a few dozen glyphs.
FONT_FACES: tuple[str, ...] = tuple(
    f"DejaVu{family}{style}.ttf"
    for family in ("Sans", "Serif", "SansMono")
    for style in (
        ("", "-Bold", "-Oblique", "-BoldOblique")
        if family != "Serif"
        else ("", "-Bold", "-Italic", "-BoldItalic")
    )
)


def default_cache_dir() -> Path:
    """``$PML_RANK_CACHE/glyphs`` if the variable is set, else ``~/.cache/pml_rank_plugins/glyphs``."""
    base = os.environ.get("PML_RANK_CACHE")
    base = Path(base) if base else Path.home() / ".cache" / "pml_rank_plugins"
    return base / "glyphs"


def font_dir() -> Path:
    """The TrueType fonts matplotlib ships. matplotlib is imported in the functions that render or
    key glyphs: ``data`` is imported by every run, most of which draw no glyph."""
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


@lru_cache(maxsize=None)
def _charmap(face: str) -> frozenset[int]:
    from matplotlib.ft2font import FT2Font

    return frozenset(FT2Font(str(font_dir() / face)).get_charmap())


@lru_cache(maxsize=None)
def _font(face: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(font_dir() / face), size)


def _render_centered(
    char: str, face: str, size: int, canvas: int, stroke: int = 0
) -> Image.Image | None:
    """``char`` drawn white on black, ink box centred in a ``canvas`` square; None if no ink."""
    font = _font(face, size)
    image = Image.new("L", (canvas, canvas), 0)
    draw = ImageDraw.Draw(image)
    draw.text((0, 0), char, font=font, fill=255, stroke_width=stroke, stroke_fill=255)
    box = image.getbbox()
    if box is None:
        return None
    x0, y0, x1, y1 = box
    centred = Image.new("L", (canvas, canvas), 0)
    centred.paste(image.crop(box), ((canvas - (x1 - x0)) // 2, (canvas - (y1 - y0)) // 2))
    return centred


def glyph_classes(
    max_classes_per_category: int = 40, image_size: int = 32
) -> list[tuple[str, str]]:
    """The ``(character, category)`` classes, in class-id order. Independent of the seed.

    A character qualifies when at least 3 of the 12 faces map it (``FT2Font.get_charmap``, so
    no .notdef boxes) and it has ink. Characters whose reference rendering (DejaVu Sans) is
    pixel-identical to an earlier class -- Latin A, Greek Alpha, Cyrillic A -- are dropped, so no
    two classes are indistinguishable. Categories with more candidates keep
    ``max_classes_per_category`` of them, evenly spaced in code point order.
    """
    size = _font_size(image_size)
    canvas = 2 * image_size
    seen: set[bytes] = set()
    classes: list[tuple[str, str]] = []
    for category, ranges in GLYPH_CATEGORIES:
        candidates = []
        for lo, hi in ranges:
            for code in range(lo, hi + 1):
                if len(_faces_for(code)) < 3:
                    continue
                reference = _render_centered(chr(code), FONT_FACES[0], size, canvas)
                if reference is None:
                    continue
                key = reference.tobytes()
                if key in seen:
                    continue
                seen.add(key)
                candidates.append(chr(code))
        if len(candidates) > max_classes_per_category:
            keep = np.linspace(0, len(candidates) - 1, max_classes_per_category).round()
            candidates = [candidates[int(i)] for i in keep]
        classes.extend((ch, category) for ch in candidates)
    return classes


def _font_size(image_size: int) -> int:
    # 26 px at 32 x 32 puts a capital at ~19 px tall, leaving room for rotation and shift.
    return max(6, round(26 * image_size / 32))


@lru_cache(maxsize=None)
def _faces_for(code: int) -> tuple[str, ...]:
    return tuple(face for face in FONT_FACES if code in _charmap(face))


def _render_instance(
    char: str, rng: np.random.Generator, image_size: int, noise_std: float
) -> np.ndarray:
    """One random rendering of ``char``: face, stroke, affine warp, noise. Returns uint8 (S, S)."""
    faces = _faces_for(ord(char))
    face = faces[rng.integers(len(faces))]
    stroke = int(rng.integers(0, 3) == 2)  # thicker stroke one time in three
    canvas = 2 * image_size
    glyph = _render_centered(char, face, _font_size(image_size), canvas, stroke)
    if glyph is None:  # cannot happen for a class that passed glyph_classes; keep it explicit
        raise RuntimeError(f"{face} renders no ink for U+{ord(char):04X}")
    angle = math.radians(rng.uniform(-12.0, 12.0))
    shear = rng.uniform(-0.2, 0.2)
    zoom = rng.uniform(0.85, 1.1)
    shift = rng.uniform(-2.0, 2.0, size=2) * image_size / 32
    cos, sin = math.cos(angle), math.sin(angle)
    # forward map (glyph -> output): zoom * R(angle) @ [[1, shear], [0, 1]]; PIL wants its inverse.
    forward = zoom * np.array([[cos, -sin], [sin, cos]]) @ np.array([[1.0, shear], [0.0, 1.0]])
    inverse = np.linalg.inv(forward)
    out_centre = np.array([image_size / 2, image_size / 2]) + shift
    offset = np.array([canvas / 2, canvas / 2]) - inverse @ out_centre
    data = (inverse[0, 0], inverse[0, 1], offset[0], inverse[1, 0], inverse[1, 1], offset[1])
    warped = glyph.transform(
        (image_size, image_size), Image.Transform.AFFINE, data, Image.Resampling.BILINEAR
    )
    array = np.asarray(warped, dtype=np.float32)
    sigma = rng.uniform(0.0, noise_std) * 255.0
    array = array + rng.normal(0.0, 1.0, size=array.shape).astype(np.float32) * sigma
    return np.clip(array.round(), 0, 255).astype(np.uint8)


def render_glyphs(
    seed: int = 0,
    images_per_class: int = 20,
    image_size: int = 32,
    max_classes_per_category: int = 40,
    categories: Sequence[str] | None = None,
    noise_std: float = 0.08,
) -> dict[str, np.ndarray]:
    """Render the glyph set. Returns ``images`` uint8 ``(N, S, S)``, ``labels`` int64 ``(N, 2)``,
    ``class_names`` and ``category_names``. Deterministic for the arguments (and the installed
    Pillow/FreeType and matplotlib fonts); each class draws from its own RNG stream
    ``SeedSequence([seed, code point])``, so a class renders the same whatever else is selected.
    O(N) renderings of a ``2S x 2S`` canvas.
    """
    names = [name for name, _ in GLYPH_CATEGORIES]
    if categories is None:
        categories = names
    unknown = sorted(set(categories) - set(names))
    if unknown:
        raise ValueError(f"unknown glyph categories {unknown}; choose from {names}")
    if images_per_class < 1 or image_size < 8 or max_classes_per_category < 1:
        raise ValueError(
            "need images_per_class >= 1, image_size >= 8, max_classes_per_category >= 1"
        )
    chosen = [name for name in names if name in set(categories)]
    classes = [
        (ch, cat)
        for ch, cat in glyph_classes(max_classes_per_category, image_size)
        if cat in set(chosen)
    ]
    images = np.empty((len(classes) * images_per_class, image_size, image_size), np.uint8)
    labels = np.empty((len(classes) * images_per_class, 2), np.int64)
    row = 0
    for class_id, (char, category) in enumerate(classes):
        rng = np.random.default_rng(np.random.SeedSequence([seed, ord(char)]))
        for _ in range(images_per_class):
            images[row] = _render_instance(char, rng, image_size, noise_std)
            labels[row] = (class_id, chosen.index(category))
            row += 1
    return {
        "images": images,
        "labels": labels,
        "class_names": np.array([ch for ch, _ in classes], dtype=str),
        "category_names": np.array(chosen, dtype=str),
    }


class GlyphDataset(InMemoryImageDataset):
    """Rendered Unicode glyphs, 32 x 32 grayscale (white ink on black), cached on disk.

    With the defaults: 13 categories, about 400 classes (at most 40 per category), 20 images per
    class. Built in a few seconds on one core and cached under ``root`` as
    ``glyphs-<hash>.npz``, the hash covering every parameter plus ``GLYPH_CACHE_VERSION`` and
    the Pillow/matplotlib versions; the file is written atomically (temp file + ``os.replace``)
    and verified when read (``read_cache``); a bad or stale cache is rebuilt with one
    :class:`~pml_rank_plugins.data.glyphs.GlyphCacheWarning` naming the file and why.

    Args:
        root: cache directory; default ``default_cache_dir()`` (env ``PML_RANK_CACHE``).
        seed: rendering seed.
        transform: callable applied to the PIL image (mode ``"L"``); default converts it to a
            float tensor ``(1, S, S)`` in [0, 1].
        images_per_class, image_size, max_classes_per_category, categories, noise_std: see
            :func:`~pml_rank_plugins.data.glyphs.render_glyphs`.

    Attributes:
        images: uint8 ``(N, S, S)``; labels: int64 ``(N, 2)`` ``[class, category]``;
        class_names: the character of each class; category_names: the name of each category.
        cache_params: the normalized rendering parameters the cache file is keyed by.
    """

    def __init__(
        self,
        root: str | Path | None = None,
        seed: int = 0,
        transform: Callable | None = None,
        images_per_class: int = 20,
        image_size: int = 32,
        max_classes_per_category: int = 40,
        categories: Sequence[str] | None = None,
        noise_std: float = 0.08,
    ):
        params = {
            "seed": int(seed),
            "images_per_class": int(images_per_class),
            "image_size": int(image_size),
            "max_classes_per_category": int(max_classes_per_category),
            "categories": None if categories is None else sorted(categories),
            "noise_std": float(noise_std),
        }
        self.cache_params = params
        self.root = Path(root) if root is not None else default_cache_dir()
        self.cache_path = self.root / f"glyphs-{_cache_key(params)}.npz"
        data = self._load_or_build(params)
        self.images = data["images"]
        self.labels = data["labels"]
        self.class_names = [str(c) for c in data["class_names"]]
        self.category_names = [str(c) for c in data["category_names"]]
        self.transform = transform

    def _load_or_build(self, params: dict) -> dict[str, np.ndarray]:
        if self.cache_path.is_file():
            try:
                return read_cache(self.cache_path, params)
            except InvalidGlyphCache as problem:
                # a bad cache is never trusted, and never a reason to fail: say so once, rebuild
                warnings.warn(
                    f"glyph cache {self.cache_path} is {problem}; rebuilding it",
                    GlyphCacheWarning,
                    stacklevel=3,
                )
        data = render_glyphs(**params)
        write_cache(self.cache_path, data, params)
        return data


def write_cache(path: Path, data: dict[str, np.ndarray], params: dict) -> None:
    """Write ``data`` and its verification record to a temporary file beside ``path``, then
    ``os.replace`` it over ``path`` (a reader never sees half a cache; only our temporary file is
    ever removed).

    Args:
        path: the cache file.
        data: the arrays of :func:`render_glyphs`.
        params: the dataset's ``cache_params``, recorded with their key in the file.
    """
    path = Path(path)
    meta = {"key": _cache_key(params), "params": params, "sha256": _checksum(data)}
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            np.savez_compressed(out, meta=np.array(json.dumps(meta)), **data)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a cache may be shared
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def read_cache(path: Path, params: dict) -> dict[str, np.ndarray]:
    """Read a cache file and verify it against ``params``.

    Args:
        path: the cache file.
        params: the ``cache_params`` of the dataset that wants it.

    Returns:
        The arrays of :func:`render_glyphs`.

    Raises:
        InvalidGlyphCache: empty, unreadable, no or a malformed verification record, written
            for other parameters or versions, checksum mismatch, or shapes, dtypes or class
            counts that do not follow from ``params``.
    """
    path = Path(path)
    if path.stat().st_size == 0:
        raise InvalidGlyphCache("empty (0 bytes)")
    try:
        # our handle: a failing np.load leaks no file; without a zip signature np.load would
        # take the file for an .npy array or a pickle
        with open(path, "rb") as handle:
            if handle.read(4) != b"PK\x03\x04":
                raise InvalidGlyphCache("not an .npz archive (no zip signature)")
            handle.seek(0)
            with np.load(handle, allow_pickle=False) as cached:
                if "meta" not in cached.files:
                    raise InvalidGlyphCache(
                        "missing its verification record (an older or foreign file)"
                    )
                meta = json.loads(str(cached["meta"]))
                data = {name: cached[name] for name in _ARRAYS}
    except _READ_ERRORS as err:
        raise InvalidGlyphCache(f"unreadable ({type(err).__name__}: {err})") from err
    if not isinstance(meta, dict):
        raise InvalidGlyphCache("carrying a malformed verification record")
    if meta.get("key") != _cache_key(params):  # the key covers GLYPH_CACHE_VERSION too
        raise InvalidGlyphCache(f"for other parameters ({meta.get('params')})")
    if meta.get("sha256") != _checksum(data):
        raise InvalidGlyphCache("corrupt: the arrays do not match the recorded sha256 checksum")
    problem = _content_problem(data, params)
    if problem:
        raise InvalidGlyphCache(f"inconsistent with its parameters: {problem}")
    return data


def _checksum(data: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in _ARRAYS:
        array = np.ascontiguousarray(data[name])
        digest.update(json.dumps([name, array.dtype.str, list(array.shape)]).encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _content_problem(data: dict[str, np.ndarray], params: dict) -> str | None:
    # What contradicts what render_glyphs makes of params (its row order included), or None.
    names = [name for name, _ in GLYPH_CATEGORIES]
    wanted = names if params["categories"] is None else params["categories"]
    chosen = [name for name in names if name in set(wanted)]
    size, per_class = params["image_size"], params["images_per_class"]
    images, labels, class_names, category_names = (data[name] for name in _ARRAYS)
    if category_names.ndim != 1 or category_names.tolist() != chosen:
        return f"category_names are {category_names.tolist()}, expected {chosen}"
    if class_names.ndim != 1 or len(set(class_names.tolist())) != len(class_names):
        return "class_names are not one list of distinct characters"
    n_classes = len(class_names)
    rows = n_classes * per_class
    if images.dtype != np.uint8 or images.shape != (rows, size, size):
        return f"images are {images.dtype} {images.shape}, expected uint8 {(rows, size, size)}"
    if labels.dtype != np.int64 or labels.shape != (rows, 2):
        return f"labels are {labels.dtype} {labels.shape}, expected int64 {(rows, 2)}"
    if not np.array_equal(labels[:, 0], np.repeat(np.arange(n_classes), per_class)):
        return f"class labels are not 0..{n_classes - 1} in order, {per_class} images each"
    if n_classes:
        category_of = labels[::per_class, 1]
        if (
            not np.array_equal(labels[:, 1], np.repeat(category_of, per_class))
            or category_of.min() < 0
            or category_of.max() >= len(chosen)
            or np.any(np.diff(category_of) < 0)
        ):
            return f"category labels are not one of 0..{len(chosen) - 1} per class, in order"
        if np.bincount(category_of).max() > params["max_classes_per_category"]:
            return "a category has more than max_classes_per_category classes"
    return None


def _cache_key(params: dict) -> str:
    import matplotlib

    key = dict(
        params,
        version=GLYPH_CACHE_VERSION,
        pillow=PIL.__version__,
        matplotlib=matplotlib.__version__,
        fonts=[os.path.getsize(p) for p in sorted(glob.glob(str(font_dir() / "DejaVu*.ttf")))],
    )
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


__all__ = [
    "GLYPH_CATEGORIES",
    "GlyphCacheWarning",
    "GlyphDataset",
    "glyph_classes",
    "render_glyphs",
]
