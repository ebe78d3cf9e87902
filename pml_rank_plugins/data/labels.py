"""The two-level label convention shared by every dataset and sampler.

Labels are an integer array of shape ``(N, 2)``:

* column 0 (``CLASS``) -- the class, i.e. the identity that retrieval must find;
* column 1 (``CATEGORY``) -- the category (super-class) the class belongs to; every item of a
  class has the same category. ``UNLABELED`` (-1) marks items without a category
  (PKU VehicleID vehicles with no model label).
"""

from __future__ import annotations

import numpy as np
import torch

CLASS = 0
CATEGORY = 1
UNLABELED = -1


def as_two_level(labels, categories=None) -> np.ndarray:
    """Return labels as an ``(N, 2)`` int64 array ``[class, category]``.

    Accepts an ``(N, 2)`` array/tensor, or a 1-D class array plus a 1-D ``categories`` array.
    Raises ``ValueError`` on wrong shapes, lengths, or a class split across categories. O(N log N).
    """
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    labels = np.asarray(labels)
    if categories is not None:
        if isinstance(categories, torch.Tensor):
            categories = categories.detach().cpu().numpy()
        categories = np.asarray(categories)
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
