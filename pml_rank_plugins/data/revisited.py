"""Revisited Oxford 5k / Paris 6k (Radenovic et al., CVPR 2018) in the published layout."""

from __future__ import annotations

import math
import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from ..functional.revisited import GROUND_TRUTH_KEYS, check_ground_truth_entry
from .images import DatasetFormatError, ImageListDataset
from .labels import UNLABELED

NAMES = ("roxford5k", "rparis6k")
SPLITS = ("query", "database")
GROUND_TRUTH_LISTS = GROUND_TRUTH_KEYS

# Globals a ground-truth pickle may name: what numpy arrays and scalars need under pickle
# protocols 2-5 (numpy 1.x and 2.x module names; ``_codecs.encode`` and ``bytes`` rebuild byte
# strings in protocol 2, ``__builtin__`` being Python 2's name of ``builtins``).
# Anything else is refused, so that loading a pickle cannot run arbitrary code.
_ALLOWED_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
    ("builtins", "bytes"),
    ("__builtin__", "bytes"),
    *(
        (f"numpy.{core}.{module}", name)
        for core in ("core", "_core")
        for module, name in (
            ("multiarray", "_reconstruct"),
            ("multiarray", "scalar"),
            ("numeric", "_frombuffer"),
        )
    ),
}


class _GroundTruthUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: a ground-truth file holds only lists, dicts, "
            "numbers and numpy arrays"
        )


def load_ground_truth(path: str | Path) -> dict:
    """Load and validate a ``gnd_<name>.pkl``.

    Returns ``{"imlist": [str], "qimlist": [str], "gnd": [{"bbx": (x1, y1, x2, y2),
    "easy"/"hard"/"junk": int64 array}]}``. Raises :class:`DatasetFormatError` naming the file
    and the key (``gnd[3]['junk']``) for a missing file or key, a wrong type, a box that is not
    ``x1 < x2, y1 < y2`` with finite non-negative corners, an index outside ``imlist`` or an index
    in two lists of one query.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetFormatError(
            f"{path}: ground-truth file not found (download gnd_roxford5k.pkl / gnd_rparis6k.pkl "
            "from the Revisited Oxford and Paris page and put it next to the jpg/ folder)"
        )
    try:
        with open(path, "rb") as handle:
            # latin1: also reads pickles written by Python 2 (byte strings, numpy arrays)
            raw = _GroundTruthUnpickler(handle, encoding="latin1").load()
    except Exception as err:  # any unpickling failure is a format problem of this file
        raise DatasetFormatError(f"{path}: not a readable ground-truth pickle ({err})") from err
    if not isinstance(raw, Mapping):
        raise DatasetFormatError(f"{path}: expected a dict, got {type(raw).__name__}")
    for key in ("imlist", "qimlist", "gnd"):
        if key not in raw:
            raise DatasetFormatError(
                f"{path}: missing key {key!r} (keys: {sorted(map(str, raw))}); expected "
                "'imlist', 'qimlist' and 'gnd'"
            )
    imlist = _names(path, "imlist", raw["imlist"])
    qimlist = _names(path, "qimlist", raw["qimlist"])
    entries = raw["gnd"]
    if isinstance(entries, (str, bytes, Mapping)) or not isinstance(entries, Sequence):
        raise DatasetFormatError(f"{path}: 'gnd' must be a list of dicts, one per query")
    if len(entries) != len(qimlist):
        raise DatasetFormatError(
            f"{path}: 'gnd' has {len(entries)} entries but 'qimlist' {len(qimlist)} queries"
        )
    gnd = [_query_truth(path, q, entry, len(imlist)) for q, entry in enumerate(entries)]
    return {"imlist": imlist, "qimlist": qimlist, "gnd": gnd}


def _names(path: Path, key: str, value) -> list[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise DatasetFormatError(f"{path}: {key!r} must be a list of image names")
    names = []
    for i, name in enumerate(value):
        if isinstance(name, bytes):
            name = name.decode("latin1")
        if not isinstance(name, str) or not name.strip():
            raise DatasetFormatError(f"{path}: {key}[{i}] is not an image name: {name!r}")
        names.append(name)
    if not names:
        raise DatasetFormatError(f"{path}: {key!r} is empty")
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        first = seen.setdefault(name, i)
        if first != i:
            raise DatasetFormatError(f"{path}: {key}[{i}] repeats {key}[{first}] ({name!r})")
    return names


def _query_truth(path: Path, query: int, entry, num_db: int) -> dict:
    where = f"{path}: gnd[{query}]"
    if not isinstance(entry, Mapping):
        raise DatasetFormatError(f"{where} must be a dict, got {type(entry).__name__}")
    for key in ("bbx",) + GROUND_TRUTH_LISTS:
        if key not in entry:
            raise DatasetFormatError(
                f"{where} has no key {key!r} (keys: {sorted(map(str, entry))}); every query "
                "needs 'bbx', 'easy', 'hard' and 'junk'"
            )
    try:
        box = tuple(float(v) for v in np.asarray(entry["bbx"], dtype=np.float64).reshape(-1))
    except (TypeError, ValueError):
        box = ()
    if (
        len(box) != 4
        or not all(math.isfinite(v) and v >= 0 for v in box)
        or not (box[0] < box[2] and box[1] < box[3])
    ):
        raise DatasetFormatError(
            f"{where}['bbx'] must be [x1, y1, x2, y2] with 0 <= x1 < x2 and 0 <= y1 < y2, "
            f"got {entry['bbx']!r}"
        )
    try:
        lists = check_ground_truth_entry(entry, where, num_db, "'imlist'")
    except ValueError as e:
        raise DatasetFormatError(str(e)) from None
    return {"bbx": box, **lists}


class RevisitedOxfordParis(ImageListDataset):
    """Revisited Oxford 5k / Paris 6k: ``<root>/<name>/gnd_<name>.pkl`` and
    ``<root>/<name>/jpg/<image name>.jpg``.

    Args:
        root: folder holding ``roxford5k/`` and/or ``rparis6k/``.
        name: ``"roxford5k"`` or ``"rparis6k"``.
        split: ``"query"`` (the 70 queries of ``qimlist``, each cropped to its box ``bbx`` as the
            protocol prescribes) or ``"database"`` (``imlist``).
        transform: callable on the PIL RGB image (after the crop); default: float tensor.

    Labels (``(N, 2)``, category always -1): relevance here is per query (easy / hard / junk
    lists), not a class, so the labels only identify items. Query ``q`` has class ``q``;
    database image ``i`` has class ``-(i + 1)``: every database image is alone in its class and
    no class is shared between the two splits, so PML's k-NN metrics
    (``AccuracyCalculator``) find no same-class pairs instead of treating the database as one
    big class. Evaluate with :func:`pml_rank_plugins.functional.revisited_evaluate`
    (query embeddings in query order, database embeddings in database order, ``gnd``).

    Attributes:
        gnd: per query ``{"bbx": (x1, y1, x2, y2), "easy", "hard", "junk": int64 arrays of
            database indices}`` (both splits expose it); imlist, qimlist: the image names;
        boxes: ``(N, 4)`` float crop boxes for the query split, None for the database.

    Every listed image is checked to exist when the dataset is built (a few thousand ``stat``
    calls), so a wrong root fails at once naming the first missing file.
    """

    def __init__(
        self,
        root: str | Path,
        name: str = "roxford5k",
        split: str = "query",
        transform: Callable | None = None,
    ):
        if name not in NAMES:
            raise ValueError(f"name must be one of {NAMES}, got {name!r}")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        folder = Path(root) / name
        truth = load_ground_truth(folder / f"gnd_{name}.pkl")
        self.name, self.split = name, split
        self.imlist, self.qimlist, self.gnd = truth["imlist"], truth["qimlist"], truth["gnd"]
        if split == "query":
            names = self.qimlist
            labels = [(q, UNLABELED) for q in range(len(names))]
            self.boxes = np.array([entry["bbx"] for entry in self.gnd], dtype=np.float64)
        else:
            names = self.imlist
            labels = [(-(i + 1), UNLABELED) for i in range(len(names))]
            self.boxes = None
        super().__init__(
            [f"{image}.jpg" for image in names], labels, root=folder / "jpg", transform=transform
        )
        key = "qimlist" if split == "query" else "imlist"
        for i in range(len(self.paths)):
            if not self.image_path(i).is_file():
                raise DatasetFormatError(
                    f"{self.image_path(i)}: image file not found ({key}[{i}] of "
                    f"{folder / f'gnd_{name}.pkl'})"
                )

    def load(self, index: int) -> Image.Image:
        """The PIL image of item ``index``; a query is cropped to its ``bbx`` (PIL rounds the
        corners to integers), which must lie inside the image."""
        image = super().load(index)
        if self.boxes is None:
            return image
        x1, y1, x2, y2 = (int(round(v)) for v in self.boxes[index])
        width, height = image.size
        if x2 > width or y2 > height or x1 >= x2 or y1 >= y2:
            raise DatasetFormatError(
                f"{self.image_path(index)}: gnd[{index}]['bbx'] = {tuple(self.boxes[index])} "
                f"does not fit the {width} x {height} image"
            )
        return image.crop((x1, y1, x2, y2))
