"""ImageFolderDataset: one's own images, one sub-folder per class (torchvision's ``ImageFolder``
layout), with the two-level labels, the class names and a scan that names every bad file."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Callable

from .images import IMAGE_SUFFIXES, DatasetFormatError, ImageListDataset, format_error
from .labels import UNLABELED

MAPPING_HEADER = ["class", "category"]


class ImageFolderDataset(ImageListDataset):
    """Images in class sub-folders, ``root/<class>/<image>``, or under category folders,
    ``root/<category>/<class>/<image>`` (``category_folders=True``).

    **Classes.** Each sub-folder of ``root`` (of each category folder) holding at least one
    image file is a class. Its name is the folder's path relative to ``root`` (``"cat"``, or
    ``"animals/cat"`` under category folders: unique even when two categories have a class of
    the same name). Class ids are ``0..C-1`` in sorted order of the names (Python string order,
    the same on every machine and filesystem), so the same folder always gets the same ids;
    ``class_names[id]`` is the name of class ``id``. Items are ordered by class id, then file name.

    **Categories** (for ``CategoryHardSampler``'s category-hard batches), from one of:

    * the parent folders: ``category_folders=True``; ``category_names`` are their names;
    * a mapping file: ``category_file``, a UTF-8 CSV with the header ``class,category`` and one
      ``class folder name,category name`` row per class (quote a name holding a comma, as CSV
      does). Every class folder needs a row; rows of classes without a folder are ignored (one
      file may map a larger collection). A class listed twice is an error naming both lines.

    Category ids are ``0..K-1`` in sorted order of the category names; without either option every
    item's category is ``-1`` (unlabeled), and ``category_names`` is ``[]``.

    **What is read.** Image files are those ending in ``IMAGE_SUFFIXES`` (any case), directly in a
    class folder. Names starting with ``.`` (``.DS_Store``, ``.git``) are skipped. Anything else --
    a non-image file, a folder inside a class folder, a file outside the class folders -- is not
    used and is listed, with the reason, in ``ignored``; class folders without any image file are
    left out of the classes and listed in ``empty_classes``. :meth:`scan` reports all of these,
    plus every image file whose header PIL cannot read, as ``(path, reason)`` pairs (what
    ``pml-rank check`` prints). Building lists the folders only (no image is opened: O(files));
    images are decoded lazily in ``__getitem__``.

    Args:
        root: the image folder.
        category_folders: read ``root/<category>/<class>/<image>``.
        category_file: the class -> category CSV (absolute, or relative to the current folder;
            in a config, relative to the data root like ``root``). Not with ``category_folders``.
        transform: callable on the PIL image; default: float tensor ``(C, H, W)`` in [0, 1].
        mode: the PIL mode images are converted to (``"RGB"``, or ``"L"`` for grayscale).

    Attributes:
        labels: ``(N, 2)`` int64 ``[class id, category id]`` (category ``-1`` without categories).
        class_names: ``C`` class names (folder paths relative to ``root``), by class id.
        category_names: ``K`` category names by category id (``[]`` without categories).
        paths: the image files relative to ``root``, one per item.
        empty_classes: class folders without image files (not classes).
        ignored: ``(path, reason)`` of every entry not used (see above).

    Raises:
        DatasetFormatError: ``root`` is not a folder or holds no image in any class folder, a
            class folder has no row in ``category_file``, or ``category_file`` is malformed (the
            message names the path, and the line).
        ValueError: both ``category_folders`` and ``category_file`` are given.
    """

    def __init__(
        self,
        root: str | Path,
        category_folders: bool = False,
        category_file: str | Path | None = None,
        transform: Callable | None = None,
        mode: str = "RGB",
    ):
        root = Path(root)
        if category_folders and category_file is not None:
            raise ValueError(
                "ImageFolderDataset: give category_folders=True (root/<category>/<class>/) or "
                "category_file (a class,category CSV for root/<class>/), not both"
            )
        if not root.is_dir():
            raise DatasetFormatError(f"{root}: image folder not found (or not a folder)")
        self.ignored: list[tuple[Path, str]] = []
        self.empty_classes: list[Path] = []
        folders = self._class_folders(root, category_folders)
        files = {rel: self._image_files(root / rel, category_folders) for rel in folders}
        self.empty_classes += [root / rel for rel, found in files.items() if not found]
        self.class_names = sorted(rel for rel, found in files.items() if found)
        if not self.class_names:
            raise DatasetFormatError(self._no_images_message(root, category_folders, folders))
        self.category_file = Path(category_file) if category_file is not None else None
        if category_folders:
            category_of = {rel: folders[rel] for rel in self.class_names}
        elif self.category_file is not None:
            category_of = _read_mapping(self.category_file, self.class_names, root)
        else:
            category_of = {}
        self.category_names = sorted(set(category_of.values()))
        category_id = {name: i for i, name in enumerate(self.category_names)}
        paths, labels = [], []
        for class_id, rel in enumerate(self.class_names):
            category = category_id[category_of[rel]] if category_of else UNLABELED
            for file in files[rel]:
                paths.append(f"{rel}/{file.name}")
                labels.append((class_id, category))
        super().__init__(paths, labels, root=root, transform=transform, mode=mode)

    def _class_folders(self, root: Path, category_folders: bool) -> dict[str, str | None]:
        """``{class folder relative to root: its category folder's name or None}``; files
        outside the class folders and category folders without class folders go to
        ``ignored``."""
        layout = "root/<category>/<class>/" if category_folders else "root/<class>/"
        out: dict[str, str | None] = {}
        for entry in _visible(root):
            if not entry.is_dir():
                self.ignored.append(
                    (entry, f"a file outside the class folders ({layout}): not used")
                )
            elif not category_folders:
                out[entry.name] = None
            else:
                inner = _visible(entry)
                for sub in inner:
                    if sub.is_dir():
                        out[f"{entry.name}/{sub.name}"] = entry.name
                    else:
                        why = f"a file in a category folder, outside the class folders ({layout})"
                        self.ignored.append((sub, f"{why}: not used"))
                if not any(sub.is_dir() for sub in inner):
                    self.ignored.append(
                        (entry, "a category folder without class folders: not used")
                    )
        return out

    def _image_files(self, folder: Path, category_folders: bool) -> list[Path]:
        """The image files directly in a class folder, sorted by name; the rest to ``ignored``."""
        found = []
        for entry in _visible(folder):
            if entry.is_dir():
                why = "a folder inside a class folder: not read (images go directly in the class "
                hint = "" if category_folders else "; root/<category>/<class>/: category_folders"
                self.ignored.append((entry, f"{why}folder{hint})"))
            elif entry.suffix.lower() in IMAGE_SUFFIXES:
                found.append(entry)
            else:
                suffix = entry.suffix or "none"
                why = f"not an image file (suffix {suffix}; images end in {', '.join(IMAGE_SUFFIXES)})"
                self.ignored.append((entry, f"{why}: not used"))
        return found

    @staticmethod
    def _no_images_message(root: Path, category_folders: bool, folders: dict) -> str:
        layout = "root/<category>/<class>/<image>" if category_folders else "root/<class>/<image>"
        where = f"{len(folders)} class folder(s)" if folders else "no class folder"
        hint = ""
        if category_folders and not folders:
            hint = "; for root/<class>/<image> drop category_folders"
        elif not category_folders and folders:
            hint = "; for root/<category>/<class>/<image> pass category_folders=True"
        return f"{root}: no image file in any class folder ({layout}; {where} found){hint}"

    def scan(
        self, progress: Callable[[int, int], None] | None = None, headers: bool = True
    ) -> list[tuple[str, str]]:
        """Every problem of the folder, as ``(path, reason)`` pairs, for ``pml-rank check``.

        The empty class folders and ignored entries found when the dataset was built, then (with
        ``headers``) every image file whose header PIL cannot read
        (:meth:`ImageListDataset.scan <pml_rank_plugins.data.ImageListDataset.scan>`:
        ``progress(done, total)`` after each file; one ``open`` and a few hundred bytes read per
        image).

        Returns:
            ``[(path, reason), ...]``: empty class folders first, then ignored entries, then
            unreadable images in item order; ``[]`` for a clean folder.
        """
        problems = [
            (str(p), "empty class folder: no image file in it (left out of the classes)")
            for p in self.empty_classes
        ]
        problems += [(str(p), reason) for p, reason in self.ignored]
        return problems + (super().scan(progress) if headers else [])


def _visible(folder: Path) -> list[Path]:
    """The entries of ``folder`` not starting with ``.``, sorted by name."""
    return sorted((p for p in folder.iterdir() if not p.name.startswith(".")), key=lambda p: p.name)


def _read_mapping(path: Path, class_names: list[str], root: Path) -> dict[str, str]:
    """``{class name: category name}`` from the ``class,category`` CSV, for ``class_names``."""
    if not path.is_file():
        raise DatasetFormatError(f"{path}: category file (class,category CSV) not found")
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: a spreadsheet's UTF-8 BOM is fine
    except UnicodeDecodeError:
        raise DatasetFormatError(f"{path}: not valid UTF-8; re-save the file as UTF-8") from None
    rows = list(csv.reader(text.splitlines()))
    if not rows or [f.strip() for f in rows[0]] != MAPPING_HEADER:
        first = rows[0] if rows else "an empty file"
        raise format_error(path, 1, f"expected the header 'class,category', got {first!r}")
    mapping: dict[str, tuple[str, int]] = {}
    for line_no, fields in enumerate(rows[1:], start=2):
        if not fields or not "".join(fields).strip():
            continue
        fields = [f.strip() for f in fields]
        if len(fields) != 2 or not all(fields):
            raise format_error(path, line_no, f"expected 'class,category', got {fields!r}")
        if fields[0] in mapping:
            first = mapping[fields[0]][1]
            raise format_error(
                path, line_no, f"class {fields[0]!r} is already listed at line {first}"
            )
        mapping[fields[0]] = (fields[1], line_no)
    missing = [name for name in class_names if name not in mapping]
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise DatasetFormatError(
            f"{path}: no category for {len(missing)} class folder(s) of {root}: {shown}; add a "
            "'class,category' row for each"
        )
    return {name: mapping[name][0] for name in class_names}
