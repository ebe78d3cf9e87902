"""``pml-rank check``'s data scan: every image file of a config's datasets opened before training.

Training decodes an image when a batch first needs it, so a file PIL cannot read stops a run
after its first iterations (and every run of a ``compare`` the same way). The scan finds them all
up front. What it scans, per dataset behind the splits (a ``Subset`` is followed to the dataset it
cuts, so a dataset shared by several splits or methods is scanned once):

* a dataset with a ``scan`` method -- its findings. The protocol: ``scan(progress=None) ->
  [(path, reason)]``, ``progress(done, total)`` called per file, and optionally
  ``scan(headers=False)`` for the findings that need no file opened. The image-list datasets
  (:meth:`ImageListDataset.scan <pml_rank_plugins.data.ImageListDataset.scan>`: CUB, Cars, SOP,
  In-Shop, VehicleID, LandmarksList, Revisited Oxford/Paris) name every listed file that is
  missing or has a header PIL cannot read; :class:`~pml_rank_plugins.data.ImageFolderDataset`
  adds its empty class folders and the files it does not use. A dataset of one's own gets the
  scan by defining the method;
* anything else (in-memory datasets such as ``GlyphDataset`` / ``OmniglotDataset``, decoded when
  built) -- nothing to scan.

A finding about an item the dataset would load is an error (:class:`DataScanError`, listing every
one); a finding about a path that is no item (a non-image file, an empty class folder) is a
note that ``check`` prints. Cost: one ``open`` and the header bytes per image, O(images); a
progress bar on stderr from ``LARGE`` (1,000) images; ``--no-scan`` (``headers=False``) opens none.
"""

from __future__ import annotations

import inspect
import sys
from typing import Mapping

from ..data.images import DatasetFormatError
from ..data.labels import wrapped_datasets

LARGE = 1000  # images from which the scan shows a progress bar
SHOWN = 20  # findings listed in an error message; the rest are counted

Finding = tuple[str, str]  # (path, reason)


class DataScanError(DatasetFormatError):
    """Image files a dataset would load cannot be read; the message lists them."""


def base_datasets(datasets: Mapping | list) -> list:
    """The distinct datasets behind ``datasets`` (a Subset's ``.dataset`` followed), in order."""
    out, seen = [], set()
    for outer in datasets.values() if isinstance(datasets, Mapping) else datasets:
        *_, dataset = wrapped_datasets(outer)  # LabeledSubset(Subset(...)): the innermost
        if id(dataset) not in seen:
            seen.add(id(dataset))
            out.append(dataset)
    return out


class _Progress:
    """``progress(done, total)`` drawing a tqdm bar on stderr once ``total >= LARGE``."""

    def __init__(self, name: str):
        self.name, self.bar = name, None

    def __call__(self, done: int, total: int) -> None:
        if total < LARGE:
            return
        if self.bar is None:
            from tqdm import tqdm

            desc = f"check: reading {self.name} image headers"
            self.bar = tqdm(total=total, desc=desc, unit="image", file=sys.stderr, leave=False)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def dataset_findings(dataset, headers: bool = True) -> list[Finding] | None:
    """``[(path, reason)]`` for one dataset (see the module docstring), or None when it has
    nothing to scan. ``headers=False``: only what needs no file opened."""
    progress = _Progress(type(dataset).__name__)
    try:
        scan = getattr(dataset, "scan", None)
        if not callable(scan):
            return None
        if headers:
            return list(scan(progress=progress))
        if "headers" in inspect.signature(scan).parameters:
            return list(scan(headers=False))
        return []
    finally:
        progress.close()


def _items(dataset) -> set[str] | None:
    """The paths ``dataset`` loads; None when it does not say (every finding is then an error)."""
    if not callable(getattr(dataset, "image_path", None)):
        return None
    return {str(dataset.image_path(i)) for i in range(len(dataset))}


def _key(dataset) -> tuple:
    """Equal for two builds of the same dataset (two methods of one config, the MLRC folds)."""
    paths = getattr(dataset, "paths", None)
    ends = tuple(str(p) for p in (paths[:1] + paths[-1:])) if isinstance(paths, list) else ()
    if not ends:
        return (id(dataset),)
    root = str(getattr(dataset, "root", ""))
    return (type(dataset).__module__, type(dataset).__qualname__, root, len(dataset), ends)


class DataScan:
    """The scan of one ``check`` call: datasets already scanned (by another method) are not
    scanned again. ``headers=False`` (``--no-scan``): no image file is opened."""

    def __init__(self, headers: bool = True):
        self.headers = headers
        self.done: dict[tuple, tuple[int, list[str]]] = {}  # key -> (images, note lines)

    def _scan(self, dataset) -> tuple[int, list[str]] | None:
        """(images, notes) of a dataset not scanned yet; raises on unreadable items."""
        findings = dataset_findings(dataset, self.headers)
        if findings is None:
            return None
        items = _items(dataset)
        notes, errors = [], []
        for path, reason in findings:
            (errors if items is None or path in items else notes).append(f"{path}: {reason}")
        if errors:
            more = [f"... and {len(errors) - SHOWN} more"] if len(errors) > SHOWN else []
            also = f"\nnot used (no error): {'; '.join(notes)}" if notes else ""
            raise DataScanError(
                f"data: {len(errors)} image file(s) that training would load cannot be read "
                "(a run stops at the first); fix or remove them (`pml-rank check --no-scan` "
                "skips this scan):\n  " + "\n  ".join(errors[:SHOWN] + more) + also
            )
        return len(dataset), notes

    def report(self, datasets: Mapping | list) -> tuple[str, list[str]]:
        """Scan ``datasets``; return the summary text (``"24 images read"``, ``"in memory"``)
        and the note lines (``"PATH: reason"``, returned once per ``check``, by the first
        method whose data holds them).

        Raises:
            DataScanError: an item's image file is missing or unreadable; the message lists
                every one (the first ``SHOWN``, 20) with the notes, and how to skip the scan.
        """
        images, notes, new_notes, scanned, keys = 0, 0, [], False, set()
        for dataset in base_datasets(datasets):
            key = _key(dataset)
            if key in keys:  # the same files built twice (train and eval transforms): once
                continue
            keys.add(key)
            if key not in self.done:
                result = self._scan(dataset)
                if result is None:
                    continue
                self.done[key] = result
                new_notes += result[1]
            scanned = True
            images += self.done[key][0]
            notes += len(self.done[key][1])
        if not scanned:
            return "in memory", []
        what = f"{images} images read" if self.headers else f"{images} images, not opened"
        return what + (f", {notes} not used (listed)" if notes else ""), new_notes
