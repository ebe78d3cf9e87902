"""A generated image folder for tests: ``make_image_folder(root, ...)``.

The layout a user brings (one sub-folder per class, optionally under a category folder), with the
faults :class:`~pml_rank_plugins.data.ImageFolderDataset` and ``pml-rank check`` must name:

* ``root/<category>/<class>/<class>_<i>.png`` (``categories=True``, the default) or
  ``root/<class>/<class>_<i>.png`` (``categories=False``); class and category names are strings
  with a space and an upper-case letter, so a sort or an encoding that drops them shows;
* ``bad_file=True``: one non-image file ``notes.txt`` in the first class folder, and one file
  with an image suffix whose bytes are no image (``broken.png``) in the second class folder;
* ``empty_class=True``: one class folder without any file (``empty class``).

Images are small RGB PNGs whose pixels depend on the class (and the image index), so a model
trained on them can tell classes apart. Returns a :class:`GeneratedFolder` describing what was
written, so tests take their expected values from the generator, never from the code under test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

# Sorted on purpose differently from the insertion order below ("Zebra" < "ant" in code points),
# so a dataset that keeps the filesystem's or the generator's order instead of sorting shows.
DEFAULT_CLASSES: dict[str, list[str]] = {
    "fruit": ["apple", "Banana split", "cherry"],
    "animals": ["ant", "Zebra", "cat"],
}


@dataclass
class GeneratedFolder:
    """What :func:`make_image_folder` wrote.

    ``classes``: ``{class folder path relative to root (posix): category name or None}``;
    ``images``: ``{class folder relative path: [image paths relative to root]}``;
    ``non_image``: the non-image file (or None); ``broken``: the file with an image suffix that is
    no image (or None); ``empty``: the empty class folder (or None); ``mapping``: the class ->
    category CSV written when ``mapping_file`` was given (or None).
    """

    root: Path
    classes: dict[str, str | None]
    images: dict[str, list[str]]
    non_image: Path | None = None
    broken: Path | None = None
    empty: Path | None = None
    mapping: Path | None = None
    size: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def num_images(self) -> int:
        """The readable images (``broken`` not counted)."""
        return sum(len(v) for v in self.images.values())


def make_image_folder(
    root: str | Path,
    classes: dict[str, list[str]] | None = None,
    images_per_class: int = 4,
    size: int = 12,
    categories: bool = True,
    bad_file: bool = True,
    empty_class: bool = True,
    mapping_file: str | Path | None = None,
) -> GeneratedFolder:
    """Write an image folder under ``root`` (created) and describe it.

    Args:
        root: the folder to fill (the dataset's ``root``).
        classes: ``{category name: [class names]}`` (default :data:`DEFAULT_CLASSES`: 2
            categories x 3 classes).
        images_per_class: PNG images per class folder.
        size: the images' side in pixels (RGB, ``size x size``).
        categories: class folders under their category folder (``root/<category>/<class>``);
            false: ``root/<class>`` (the categories then exist only in ``mapping_file``).
        bad_file: write ``notes.txt`` (not an image) and ``broken.png`` (an image suffix, no
            image) into the first and second class folders.
        empty_class: add an empty class folder ``empty class`` (under the first category).
        mapping_file: with ``categories=False``, also write this CSV (``class,category`` header,
            one ``class name,category name`` row per class; relative paths are under ``root``'s
            parent, so the file is not inside the image folder).

    Returns:
        A :class:`GeneratedFolder`.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    classes = DEFAULT_CLASSES if classes is None else classes
    out = GeneratedFolder(root=root, classes={}, images={}, size=size)
    rng = np.random.default_rng(0)
    class_id = 0
    for category, names in classes.items():
        for name in names:
            rel = f"{category}/{name}" if categories else name
            folder = root / rel
            folder.mkdir(parents=True, exist_ok=True)
            out.classes[rel] = category
            out.images[rel] = []
            base = np.zeros((size, size, 3), np.uint8)
            # a colour level per class (in 40..199, so the noise below cannot wrap a uint8)
            base[..., class_id % 3] = 40 + (37 * class_id) % 160
            for i in range(images_per_class):
                pixels = base + rng.integers(0, 30, base.shape, dtype=np.uint8)
                file = folder / f"{name.replace(' ', '_')}_{i}.png"
                Image.fromarray(pixels).save(file)
                out.images[rel].append(file.relative_to(root).as_posix())
            class_id += 1
    folders = list(out.classes)
    if bad_file:
        out.non_image = root / folders[0] / "notes.txt"
        out.non_image.write_text("not an image\n", encoding="utf-8")
        out.broken = root / folders[1 % len(folders)] / "broken.png"
        out.broken.write_bytes(b"this is not a PNG file\n")
    if empty_class:
        first_category = next(iter(classes))
        rel = f"{first_category}/empty class" if categories else "empty class"
        out.empty = root / rel
        out.empty.mkdir(parents=True, exist_ok=True)
    if mapping_file is not None:
        if categories:
            raise ValueError("mapping_file goes with categories=False (flat class folders)")
        path = Path(mapping_file)
        path = path if path.is_absolute() else root.parent / path
        rows = ["class,category"] + [f"{name},{cat}" for name, cat in out.classes.items()]
        if out.empty is not None:
            rows.append(f"empty class,{next(iter(classes))}")
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
        out.mapping = path
    return out
