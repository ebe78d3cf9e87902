"""In-Shop Clothes Retrieval (DeepFashion, Liu et al., CVPR 2016) in its published layout."""

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
    require_file,
    require_nonempty,
)

SPLITS = ("train", "query", "gallery")


class InShopClothes(ImageListDataset):
    """``list_eval_partition.txt`` (in ``root`` or ``root/Eval``): line 1 the image count, line 2
    the header ``image_name item_id evaluation_status``, then ``img/<GENDER>/<Type>/id_XXXXXXXX/
    <file>.jpg id_XXXXXXXX train|query|gallery``. Image paths are relative to ``root`` (or to
    ``root/Img`` as in the published archive).

    Labels: class = the item number (``id_00000002`` -> 2), category = index of
    ``<GENDER>/<Type>`` (e.g. ``WOMEN/Dresses``) in the sorted list of all such pairs in the file,
    so categories agree across splits (names in ``category_names``).
    """

    def __init__(self, root: str | Path, split: str = "train", transform: Callable | None = None):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        root = Path(root)
        path = root / "list_eval_partition.txt"
        if not path.is_file() and (root / "Eval" / "list_eval_partition.txt").is_file():
            path = root / "Eval" / "list_eval_partition.txt"
        require_file(path)
        with open(path, encoding="utf-8") as handle:
            head = [handle.readline() for _ in range(2)]
        if not head[0].strip().isdigit():
            raise format_error(path, 1, f"expected the image count, got {head[0]!r}")
        if head[1].split() != ["image_name", "item_id", "evaluation_status"]:
            raise format_error(
                path,
                2,
                f"expected the header 'image_name item_id evaluation_status', got {head[1]!r}",
            )
        rows = read_rows(path, 3, skip=2)
        if len(rows) != int(head[0]):
            raise format_error(path, 1, f"says {int(head[0])} images but lists {len(rows)}")
        require_nonempty(path, len(rows), "no images listed")
        parsed, seen, tracker = [], FirstLine(), CategoryTracker("item")
        for line_no, (image, item, status) in rows:
            if status not in SPLITS:
                raise format_error(path, line_no, f"unknown evaluation_status {status!r}")
            if not item.startswith("id_"):
                raise format_error(path, line_no, f"item_id should look like id_00000001: {item!r}")
            parts = Path(image).parts
            if len(parts) < 5 or parts[-2] != item:
                raise format_error(
                    path, line_no, f"image path {image!r} is not img/<GENDER>/<Type>/{item}/<file>"
                )
            number = parse_int(path, line_no, item[3:], "item_id number")
            seen.add(path, line_no, image, f"image {image!r}")
            tracker.add(path, line_no, number, f"{parts[-4]}/{parts[-3]}")
            parsed.append((image, number, f"{parts[-4]}/{parts[-3]}", status))
        self.category_names = sorted({category for _, _, category, _ in parsed})
        category_ids = {name: i for i, name in enumerate(self.category_names)}
        chosen = [row for row in parsed if row[3] == split]
        require_nonempty(path, len(chosen), f"no image of split {split!r}")
        image_root = root
        if chosen and not (root / chosen[0][0]).exists() and (root / "Img" / chosen[0][0]).exists():
            image_root = root / "Img"
        super().__init__(
            [row[0] for row in chosen],
            [(row[1], category_ids[row[2]]) for row in chosen],
            root=image_root,
            transform=transform,
        )
