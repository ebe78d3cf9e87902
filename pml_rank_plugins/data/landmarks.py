"""LandmarksList: a landmarks training set given as an image list (``path label [category]``)."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Callable

from .images import (
    CategoryTracker,
    ImageListDataset,
    format_error,
    parse_int,
    read_lines,
    require_file,
    require_nonempty,
)
from .labels import UNLABELED


class LandmarksList(ImageListDataset):
    """Images listed in a text file, one per line: ``relative/path label [category]``.

    The format of landmark training lists (e.g. the retrieval-SfM or Google Landmarks training
    sets, written out as ``path label`` lines). Rules, each enforced with a
    :class:`DatasetFormatError` naming the file and line:

    * fields are separated by whitespace, so paths cannot contain spaces;
    * ``path`` is relative to ``root`` (no absolute paths, no ``..``);
    * ``label`` (the landmark, the class) is an integer >= 0; ``category`` is optional, an
      integer >= -1; a missing category is -1 (unlabeled); every line of a label must give the
      same category;
    * a path may appear only once;
    * blank lines and lines whose first non-blank character is ``#`` are skipped (a ``#`` later
      in a line is part of a field);
    * a list with no image is an error.

    Args:
        root: folder that the listed paths start from.
        list_file: the list, absolute or relative to ``root``.
        transform: callable on the PIL RGB image; default: float tensor.

    Images are opened lazily (lists reach millions of images, so their existence is not checked
    up front); a missing or unreadable image raises :class:`DatasetFormatError` naming it when
    loaded.
    """

    def __init__(self, root: str | Path, list_file: str | Path, transform: Callable | None = None):
        root = Path(root)
        list_path = Path(list_file)
        if not list_path.is_absolute():
            list_path = root / list_path
        require_file(list_path, "image list")
        paths, labels, first_line = [], [], {}
        tracker = CategoryTracker("label")
        for line_no, line in read_lines(list_path):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            fields = text.split()
            if len(fields) not in (2, 3):
                raise format_error(
                    list_path,
                    line_no,
                    f"expected 'path label [category]' (2 or 3 fields), got {len(fields)}: "
                    f"{text!r}",
                )
            image = PurePosixPath(fields[0])
            if image.is_absolute() or Path(fields[0]).is_absolute() or ".." in image.parts:
                raise format_error(
                    list_path, line_no, f"path {fields[0]!r} must be relative to {root}"
                )
            label = parse_int(list_path, line_no, fields[1], "label")
            if label < 0:
                raise format_error(list_path, line_no, f"label must be >= 0, got {label}")
            category = UNLABELED
            if len(fields) == 3:
                category = parse_int(list_path, line_no, fields[2], "category")
                if category < UNLABELED:
                    raise format_error(
                        list_path, line_no, f"category must be >= -1 (-1 = none), got {category}"
                    )
            first = first_line.setdefault(fields[0], line_no)
            if first != line_no:
                raise format_error(
                    list_path, line_no, f"{fields[0]!r} is already listed at line {first}"
                )
            tracker.add(list_path, line_no, label, category)
            paths.append(fields[0])
            labels.append((label, category))
        require_nonempty(list_path, len(paths), "no images listed")
        self.list_file = list_path
        super().__init__(paths, labels, root=root, transform=transform)
