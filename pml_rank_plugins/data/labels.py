"""The two-level label convention shared by every dataset and sampler.

Labels are an integer array of shape ``(N, 2)``:

* column 0 (``CLASS``) -- the class, i.e. the identity that retrieval must find;
* column 1 (``CATEGORY``) -- the category (super-class) the class belongs to; every item of a
  class has the same category. ``UNLABELED`` (-1) marks items without a category
  (PKU VehicleID vehicles with no model label).

Labels as users have them (strings such as ``"cat"``, tuples, sparse numbers) become integer ids
with :func:`encode_labels`, which keeps the names; :func:`label_names` finds the names a dataset
kept (:class:`~pml_rank_plugins.data.ImageFolderDataset`'s class folders).
"""

from __future__ import annotations

from typing import Hashable, Iterable, Iterator

import numpy as np
import torch

CLASS = 0
CATEGORY = 1
UNLABELED = -1


def as_two_level(labels, categories=None) -> np.ndarray:
    """Return labels as an ``(N, 2)`` int64 array ``[class, category]``.

    Accepts an ``(N, 2)`` array/tensor, or a 1-D class array plus a 1-D ``categories`` array.
    Raises ``ValueError`` on wrong shapes, lengths, or a class split across categories, and
    ``TypeError`` on string (or other non-numeric) labels, naming :func:`encode_labels`, which
    turns them into ids. O(N log N).
    """
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    labels = _numeric(np.asarray(labels), "labels")
    if categories is not None:
        if isinstance(categories, torch.Tensor):
            categories = categories.detach().cpu().numpy()
        categories = _numeric(np.asarray(categories), "categories")
        if labels.ndim != 1 or categories.ndim != 1:
            raise ValueError(
                "with two label arrays, both must be 1-D (classes, categories); got shapes "
                f"{labels.shape} and {categories.shape}"
            )
        if len(labels) != len(categories):
            raise ValueError(
                f"classes and categories differ in length: {len(labels)} vs {len(categories)}"
            )
        labels = np.stack([labels, categories], axis=1)
    if labels.ndim != 2 or labels.shape[1] != 2:
        raise ValueError(
            f"labels must have shape (N, 2) = [class, category], got {tuple(labels.shape)}"
        )
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        if not np.all(np.equal(np.mod(labels, 1), 0)):
            raise ValueError("labels must be integers")
    labels = labels.astype(np.int64)
    if len(labels):
        pairs = np.unique(labels, axis=0)
        classes, counts = np.unique(pairs[:, CLASS], return_counts=True)
        split = classes[counts > 1]
        if len(split):
            raise ValueError(
                f"class(es) {split[:5].tolist()} appear under more than one category; "
                "every item of a class must share its category"
            )
    return labels


ENCODE_HINT = (
    "encode them first: codes, names = pml_rank_plugins.data.encode_labels(labels) "
    "(integer ids 0..C-1 in sorted order of the labels; names[id] is the label)"
)


def encode_labels(labels: Iterable[Hashable]) -> tuple[torch.Tensor, list]:
    """Class labels as users have them (strings, tuples, numbers) -> integer ids and the names.

    ``names = sorted(set(labels))`` and ``codes[i] = names.index(labels[i])``: the ids are
    ``0..C-1`` in sorted order of the labels, so the same set of labels always gets the same ids,
    whatever their order (``["dog", "cat", "dog"]`` -> ``[1, 0, 1]``, ``["cat", "dog"]``).
    ``names[code]`` turns an id back into its label. O(N log N).

    Args:
        labels: one label per item (a list, tuple, 1-D numpy array or tensor); every label
            hashable and all of them mutually sortable.

    Returns:
        ``(codes, names)``: an int64 tensor ``(N,)`` (what the losses and samplers take) and the
        list of the ``C`` distinct labels, sorted (numpy scalars as Python values).

    Raises:
        TypeError: ``labels`` is a single string or not 1-D, a label is unhashable, or the labels
            mix types that do not sort together (``"cat"`` and ``3``).
        ValueError: a label is ``None`` or NaN (the message names its position).
    """
    if isinstance(labels, (str, bytes)):
        raise TypeError(f"encode_labels: expected one label per item, got the string {labels!r}")
    if isinstance(labels, (np.ndarray, torch.Tensor)):
        if labels.ndim != 1:
            raise TypeError(
                f"encode_labels: labels must be 1-D (one per item), got shape {tuple(labels.shape)}"
            )
        labels = labels.tolist()  # numpy scalars -> Python values, so names print plainly
    items = list(labels)
    for i, value in enumerate(items):
        if value is None or (isinstance(value, float) and value != value):
            raise ValueError(f"encode_labels: label {i} is {value!r}; every item needs a label")
        try:
            hash(value)
        except TypeError:
            raise TypeError(
                f"encode_labels: label {i} ({value!r}) is unhashable; labels must be strings, "
                "numbers or tuples (one label per item, 1-D)"
            ) from None
    try:
        names = sorted(set(items))
    except TypeError:
        kinds = sorted({type(v).__name__ for v in items})
        raise TypeError(
            f"encode_labels: the labels mix types that do not sort together ({', '.join(kinds)});"
            " convert them to one type first, e.g. [str(label) for label in labels]"
        ) from None
    index = {name: code for code, name in enumerate(names)}
    return torch.tensor([index[v] for v in items], dtype=torch.long), names


def _numeric(array: np.ndarray, what: str) -> np.ndarray:
    """``array`` if its dtype is numeric (an object array of numbers is converted); a string or
    other non-numeric label raises ``TypeError`` pointing to :func:`encode_labels`."""
    if array.dtype.kind == "O" and array.size:
        converted = np.asarray(array.tolist())
        array = converted if converted.dtype.kind in "biuf" else array
    if array.dtype.kind in "biuf" or not array.size:
        return array
    example = array.reshape(-1)[0]
    example = example.item() if isinstance(example, np.generic) else example
    raise TypeError(
        f"{what} hold {type(example).__name__} values such as {example!r}, not integer class "
        f"ids; {ENCODE_HINT}"
    )


def label_names(dataset) -> tuple[list[str] | None, list[str] | None]:
    """``(class_names, category_names)`` of a dataset that keeps them (``class_names[id]`` is
    the name of class ``id``, e.g. :class:`~pml_rank_plugins.data.ImageFolderDataset`), looked up
    through ``Subset`` / :class:`~pml_rank_plugins.data.LabeledSubset` wrappers (their
    ``.dataset``; a subset keeps the ids of the dataset it cuts). ``None`` for what the dataset
    does not keep (integer ids only, as in the published benchmarks' readers). O(depth)."""
    for each in wrapped_datasets(dataset):
        classes = getattr(each, "class_names", None)
        if classes is not None:
            categories = getattr(each, "category_names", None)
            return list(classes), (list(categories) if categories else None)
    return None, None


def wrapped_datasets(dataset) -> Iterator:
    """``dataset``, then the dataset each ``Subset`` / :class:`~pml_rank_plugins.data.LabeledSubset`
    wrapper cuts (its ``.dataset``), outermost first, the dataset that holds the files last;
    stops at a cycle. O(depth)."""
    seen: set[int] = set()
    while dataset is not None and id(dataset) not in seen:
        seen.add(id(dataset))
        yield dataset
        dataset = getattr(dataset, "dataset", None)
