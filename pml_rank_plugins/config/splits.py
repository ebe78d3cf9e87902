"""Turning one dataset into named splits for the runner.

The class-disjoint split itself is ``pml_rank_plugins.data.splits.class_disjoint_split`` (or any
registered function with the same contract, named in the config's ``split:`` section). This module
only adds the item-level *query/gallery* split used by In-Shop-style retrieval, where query and
gallery share classes, and the subset wrapper that keeps ``.labels``.
"""

from __future__ import annotations

import numpy as np
import torch


def query_gallery_split(
    labels, query_fraction: float = 0.5, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Split item positions ``0..N-1`` into (query, gallery) *within* each class.

    Every class with >= 2 items puts ``max(1, round(query_fraction * n))`` items (at most n - 1)
    into the query set and the rest into the gallery, so every query has at least one same-class
    gallery item. Singleton classes go to the gallery (they act as distractors). ``labels`` is the
    (N, 2) two-level array or a 1-D class array. O(N log N).
    """
    labels = np.asarray(labels)
    classes = labels[:, 0] if labels.ndim == 2 else labels
    if not 0.0 < query_fraction < 1.0:
        raise ValueError(f"query_fraction must be in (0, 1), got {query_fraction}")
    rng = np.random.default_rng(seed)
    query, gallery = [], []
    for c in np.unique(classes):
        idx = np.flatnonzero(classes == c)
        rng.shuffle(idx)
        if len(idx) < 2:
            gallery.extend(idx.tolist())
            continue
        nq = min(len(idx) - 1, max(1, int(round(query_fraction * len(idx)))))
        query.extend(idx[:nq].tolist())
        gallery.extend(idx[nq:].tolist())
    return np.sort(np.array(query, dtype=np.int64)), np.sort(np.array(gallery, dtype=np.int64))


def labeled_subset(dataset, indices) -> torch.utils.data.Dataset:
    """A subset that keeps the two-level ``.labels`` of its items.

    Uses ``pml_rank_plugins.data.splits.LabeledSubset`` when available; otherwise a plain
    ``torch.utils.data.Subset`` with the ``labels`` attribute attached (same behaviour).
    """
    indices = np.asarray(indices, dtype=np.int64)
    try:
        from pml_rank_plugins.data.splits import LabeledSubset
    except ImportError:
        LabeledSubset = None
    if LabeledSubset is not None:
        return LabeledSubset(dataset, indices)
    subset = torch.utils.data.Subset(dataset, indices.tolist())
    subset.labels = np.asarray(dataset.labels)[indices]
    return subset
