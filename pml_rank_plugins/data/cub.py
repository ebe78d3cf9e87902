"""CUB-200-2011 (Wah et al., 2011) in its published layout, with the metric learning split."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .images import (
    FirstLine,
    ImageListDataset,
    format_error,
    parse_int,
    read_rows,
    require_nonempty,
)
from .labels import UNLABELED

SPLITS = {"train": range(1, 101), "test": range(101, 201), "all": range(1, 201)}


class CUB200(ImageListDataset):
    """``root/images.txt`` (``<image id> <path>``), ``root/image_class_labels.txt``
    (``<image id> <class id>``), images at ``root/images/<path>``.

    Split by class as in metric learning (not the dataset's own ``train_test_split.txt``):
    ``"train"`` classes 1-100, ``"test"`` 101-200, ``"all"`` both. Labels: class =
    ``class id - 1``; CUB has no super-classes, so category = -1.
    """

    def __init__(self, root: str | Path, split: str = "train", transform: Callable | None = None):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {tuple(SPLITS)}, got {split!r}")
        root = Path(root)
        images_path, labels_path = root / "images.txt", root / "image_class_labels.txt"
        images: dict[int, str] = {}
        image_rows = read_rows(images_path, 2)
        require_nonempty(images_path, len(image_rows), "no images listed")
        for line_no, (image_id, image) in image_rows:
            image_id = parse_int(images_path, line_no, image_id, "image id")
            if image_id in images:
                raise format_error(images_path, line_no, f"duplicate image id {image_id}")
            images[image_id] = image
        classes: dict[int, int] = {}
        class_rows, seen = read_rows(labels_path, 2), FirstLine()
        require_nonempty(labels_path, len(class_rows), "no class listed")
        for line_no, (image_id, class_id) in class_rows:
            image_id = parse_int(labels_path, line_no, image_id, "image id")
            class_id = parse_int(labels_path, line_no, class_id, "class id")
            if image_id not in images:
                raise format_error(labels_path, line_no, f"image id {image_id} not in images.txt")
            if not 1 <= class_id <= 200:
                raise format_error(labels_path, line_no, f"class id {class_id} not in 1..200")
            seen.add(labels_path, line_no, image_id, f"image id {image_id} (class {class_id})")
            classes[image_id] = class_id
        missing = sorted(set(images) - set(classes))
        if missing:
            raise format_error(labels_path, None, f"no class for image id(s) {missing[:5]}")
        wanted = set(SPLITS[split])
        chosen = [i for i in sorted(images) if classes[i] in wanted]
        first, last = SPLITS[split][0], SPLITS[split][-1]
        require_nonempty(
            labels_path, len(chosen), f"no image of split {split!r} (class ids {first}..{last})"
        )
        super().__init__(
            [images[i] for i in chosen],
            [(classes[i] - 1, UNLABELED) for i in chosen],
            root=root / "images",
            transform=transform,
        )
