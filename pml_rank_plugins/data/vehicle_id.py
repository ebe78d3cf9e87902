"""PKU VehicleID (Liu et al., CVPR 2016) in its published layout."""

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

SPLIT_FILES = {
    "train": "train_list.txt",
    "test800": "test_list_800.txt",
    "test1600": "test_list_1600.txt",
    "test2400": "test_list_2400.txt",
}


class VehicleID(ImageListDataset):
    """``root/train_test_split/<split file>`` (lines ``<image name> <vehicle id>``), images at
    ``root/image/<image name>.jpg``, models from ``root/attribute/model_attr.txt`` (lines
    ``<vehicle id> <model id>``).

    Labels: class = vehicle id, category = model id, or ``-1`` (unlabeled) for vehicles that
    ``model_attr.txt`` does not list -- most of them.
    """

    def __init__(self, root: str | Path, split: str = "train", transform: Callable | None = None):
        if split not in SPLIT_FILES:
            raise ValueError(f"split must be one of {tuple(SPLIT_FILES)}, got {split!r}")
        root = Path(root)
        attr_path = root / "attribute" / "model_attr.txt"
        models: dict[int, int] = {}
        attr_rows = read_rows(attr_path, 2)
        # An empty file would silently mark every vehicle unlabeled.
        require_nonempty(
            attr_path,
            len(attr_rows),
            "no vehicle listed (expected '<vehicle id> <model id>' lines)",
        )
        for line_no, (vehicle, model) in attr_rows:
            vehicle = parse_int(attr_path, line_no, vehicle, "vehicle id")
            model = parse_int(attr_path, line_no, model, "model id")
            if model < 0:
                raise format_error(attr_path, line_no, f"negative model id {model}")
            if models.setdefault(vehicle, model) != model:
                raise format_error(attr_path, line_no, f"vehicle {vehicle} has two model ids")
        list_path = root / "train_test_split" / SPLIT_FILES[split]
        paths, labels, seen = [], [], FirstLine()
        rows = read_rows(list_path, 2)
        require_nonempty(list_path, len(rows), "no images listed")
        for line_no, (image, vehicle) in rows:
            vehicle = parse_int(list_path, line_no, vehicle, "vehicle id")
            seen.add(list_path, line_no, image, f"image {image!r}")
            paths.append(f"{image}.jpg")
            labels.append((vehicle, models.get(vehicle, UNLABELED)))
        super().__init__(paths, labels, root=root / "image", transform=transform)
