"""Cars196 / Stanford Cars (Krause et al., 3dRR 2013) from ``cars_annos.mat`` (read with scipy.io)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from .images import DatasetFormatError, ImageListDataset, require_file, require_nonempty
from .labels import UNLABELED
from .matfile import MatFileError, load_mat

SPLITS = {"train": range(1, 99), "test": range(99, 197), "all": range(1, 197)}
_FIELDS = ("relative_im_path", "class")


class Cars196(ImageListDataset):
    """``root/cars_annos.mat`` (struct array ``annotations`` with fields ``relative_im_path``,
    ``bbox_x1..y2``, ``class``, ``test``; cell array ``class_names``), images at
    ``root/<relative_im_path>`` (``car_ims/000001.jpg``). The MAT-file is read with
    :func:`scipy.io.loadmat` (through :func:`pml_rank_plugins.data.load_mat`); a missing,
    damaged or v7.3 file, or a missing field, raises :class:`DatasetFormatError` naming the file.

    Split by class as in metric learning: ``"train"`` classes 1-98, ``"test"`` 99-196, ``"all"``.
    Labels: class = ``class - 1``, category = -1 (no super-classes). ``class_names`` holds the
    196 names when the file has them.
    """

    def __init__(self, root: str | Path, split: str = "train", transform: Callable | None = None):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {tuple(SPLITS)}, got {split!r}")
        root = Path(root)
        path = require_file(root / "cars_annos.mat")
        try:
            mat = load_mat(path)
        except MatFileError as err:
            raise DatasetFormatError(str(err)) from err
        annotations = mat.get("annotations")
        if not isinstance(annotations, np.ndarray) or annotations.dtype != object:
            raise DatasetFormatError(f"{path}: no struct array 'annotations'")
        paths, labels, first = [], [], {}
        wanted = set(SPLITS[split])
        records = annotations.reshape(-1, order="F")
        require_nonempty(path, len(records), "'annotations' is empty")
        for number, record in enumerate(records, start=1):
            missing = [f for f in _FIELDS if not isinstance(record, dict) or f not in record]
            if missing:
                raise DatasetFormatError(f"{path}: annotations({number}) lacks field(s) {missing}")
            image, class_value = record["relative_im_path"], np.asarray(record["class"])
            if not isinstance(image, str) or not image or class_value.size != 1:
                raise DatasetFormatError(
                    f"{path}: annotations({number}) needs a path string and one class number"
                )
            earlier = first.setdefault(image, number)
            if earlier != number:
                raise DatasetFormatError(
                    f"{path}: annotations({number}) repeats the image {image!r} of "
                    f"annotations({earlier})"
                )
            class_id = int(class_value.reshape(-1)[0])
            if not 1 <= class_id <= 196:
                raise DatasetFormatError(
                    f"{path}: annotations({number}).class = {class_id}, not in 1..196"
                )
            if class_id in wanted:
                paths.append(image)
                labels.append((class_id - 1, UNLABELED))
        require_nonempty(
            path, len(paths), f"no image of split {split!r} (classes {min(wanted)}..{max(wanted)})"
        )
        names = mat.get("class_names")
        self.class_names = (
            [str(n) for n in names.reshape(-1, order="F")]
            if isinstance(names, np.ndarray) and names.dtype == object
            else None
        )
        super().__init__(paths, labels, root=root, transform=transform)
