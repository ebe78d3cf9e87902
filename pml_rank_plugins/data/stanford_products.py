"""Stanford Online Products (Song et al., CVPR 2016) in its published layout."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .images import (
    CategoryTracker,
    FirstLine,
    ImageListDataset,
    format_error,
    parse_int,
    read_rows,
    require_nonempty,
)

_HEADER = ["image_id", "class_id", "super_class_id", "path"]


class StanfordOnlineProducts(ImageListDataset):
    """``root/Ebay_train.txt`` or ``root/Ebay_test.txt`` (header ``image_id class_id
    super_class_id path``, then one image per line; paths relative to ``root``).

    Labels: class = ``class_id - 1``, category = ``super_class_id - 1`` (the 12 product types);
    ``category_names[c]`` is the image folder of category ``c`` (``bicycle_final``, ...), or None
    for a category absent from the file.
    The published split is class-disjoint: classes 1-11318 train, 11319-22634 test.
    """

    def __init__(self, root: str | Path, split: str = "train", transform: Callable | None = None):
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        root = Path(root)
        path = root / f"Ebay_{split}.txt"
        rows = read_rows(path, 4)
        if not rows or rows[0][0] != 1 or rows[0][1] != _HEADER:
            raise format_error(path, 1, f"expected the header {' '.join(_HEADER)!r}")
        require_nonempty(path, len(rows) - 1, "no images listed after the header")
        paths, labels, folders, tracker, seen = [], [], {}, CategoryTracker("class_id"), FirstLine()
        for line_no, (_, class_id, super_id, image) in rows[1:]:
            class_id = parse_int(path, line_no, class_id, "class_id")
            super_id = parse_int(path, line_no, super_id, "super_class_id")
            if class_id < 1 or super_id < 1:
                raise format_error(path, line_no, "class_id and super_class_id start at 1")
            tracker.add(path, line_no, class_id, super_id)
            seen.add(path, line_no, image, f"image {image!r}")
            paths.append(image)
            labels.append((class_id - 1, super_id - 1))
            folders.setdefault(super_id - 1, image.split("/")[0])
        self.category_names = [folders.get(c) for c in range(max(folders, default=-1) + 1)]
        super().__init__(paths, labels, root=root, transform=transform)
