"""Class-disjoint splits: no class appears in two parts, so test classes are never seen in training.

All functions take labels as the ``(N, 2)`` two-level array (class in column 0) or a 1-D class
array, and return sorted int64 index arrays into it. Cost O(N log N).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from .labels import CLASS


def _classes_of(labels) -> np.ndarray:
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    labels = np.asarray(labels)
    if labels.ndim == 2 and labels.shape[1] == 2:
        return labels[:, CLASS].astype(np.int64)
    if labels.ndim == 1:
        return labels.astype(np.int64)
    raise ValueError(f"labels must be (N, 2) or (N,), got shape {labels.shape}")


def _indices_of(classes: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.isin(classes, chosen)).astype(np.int64)


def _ordered_classes(classes: np.ndarray, seed: int | None) -> np.ndarray:
    unique = np.unique(classes)
    if seed is None:
        return unique
    return unique[np.random.default_rng(seed).permutation(len(unique))]


def class_disjoint_split(
    labels, fractions: Sequence[float] = (0.5, 0.5), seed: int | None = 0
) -> tuple[np.ndarray, ...]:
    """Split items into ``len(fractions)`` class-disjoint parts (e.g. train/val/test).

    The distinct classes are shuffled with ``seed`` (kept in sorted order if ``seed`` is None)
    and cut at ``round(cumsum(fractions) * num_classes)``, so part ``k`` holds about
    ``fractions[k]`` of the *classes* (not of the items). ``fractions`` must be positive and sum
    to 1. Returns one sorted index array per part.
    """
    fractions = np.asarray(fractions, dtype=np.float64)
    if fractions.ndim != 1 or len(fractions) == 0 or np.any(fractions <= 0):
        raise ValueError(f"fractions must be a non-empty list of positive numbers, got {fractions}")
    if not np.isclose(fractions.sum(), 1.0):
        raise ValueError(f"fractions must sum to 1, got {fractions.sum()}")
    classes = _classes_of(labels)
    order = _ordered_classes(classes, seed)
    cuts = np.round(np.cumsum(fractions) * len(order)).astype(int)
    cuts[-1] = len(order)
    bounds = np.concatenate([[0], cuts])
    parts = tuple(
        _indices_of(classes, order[bounds[k] : bounds[k + 1]]) for k in range(len(fractions))
    )
    if len(order) and any(len(p) == 0 for p in parts):
        raise ValueError(
            f"{len(order)} classes are too few for fractions {fractions.tolist()}: a part is empty"
        )
    return parts


def first_half_split(labels) -> tuple[np.ndarray, np.ndarray]:
    """The "Metric Learning Reality Check" split (Musgrave et al., ECCV 2020, sec. 4.2):
    the first half of the classes in sorted class-id order is train+val, the second half test.
    Returns ``(trainval_idx, test_idx)``; with an odd class count the extra class goes to test.
    """
    classes = _classes_of(labels)
    unique = np.unique(classes)
    half = len(unique) // 2
    return _indices_of(classes, unique[:half]), _indices_of(classes, unique[half:])


def class_disjoint_kfold(
    labels, num_folds: int = 4, seed: int | None = 0
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Class-disjoint k-fold cross-validation over the given items' classes.

    The distinct classes (shuffled with ``seed``; sorted order if None) are cut into
    ``num_folds`` contiguous, near-equal groups; fold ``k`` validates on group ``k`` and trains on
    the others. Every class is validated on exactly once. Returns ``[(train_idx, val_idx), ...]``
    as indices into ``labels``. For the MLRC protocol apply it to the train+val part of
    :func:`first_half_split` (4 folds) and map back with ``trainval_idx[train_idx]``.
    """
    if int(num_folds) != num_folds or num_folds < 2:
        raise ValueError(f"num_folds must be an integer >= 2, got {num_folds}")
    classes = _classes_of(labels)
    order = _ordered_classes(classes, seed)
    if len(order) < num_folds:
        raise ValueError(f"{len(order)} classes cannot make {num_folds} class-disjoint folds")
    groups = np.array_split(order, int(num_folds))
    return [
        (
            _indices_of(classes, np.concatenate(groups[:k] + groups[k + 1 :])),
            _indices_of(classes, g),
        )
        for k, g in enumerate(groups)
    ]


def mlrc_protocol(labels, num_folds: int = 4, seed: int | None = None):
    """The full MLRC protocol: ``(folds, test_idx)`` where ``folds`` is the list of
    ``(train_idx, val_idx)`` of :func:`class_disjoint_kfold` over the first half of the classes,
    already mapped to indices into ``labels``, and ``test_idx`` is the second half.
    """
    trainval, test = first_half_split(labels)
    classes = _classes_of(labels)
    folds = [
        (trainval[train], trainval[val])
        for train, val in class_disjoint_kfold(classes[trainval], num_folds, seed)
    ]
    return folds, test


class LabeledSubset(Subset):
    """A :class:`torch.utils.data.Subset` that keeps ``.labels`` (the subset's rows) for samplers."""

    def __init__(self, dataset: Dataset, indices: Sequence[int]):
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        super().__init__(dataset, indices.tolist())
        self.labels = np.asarray(dataset.labels)[indices]


def query_gallery_split(
    labels, query_fraction: float = 0.5, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Split item positions ``0..N-1`` into (query, gallery) *within* each class.

    The item-level split of In-Shop-style retrieval, where query and gallery share classes (unlike
    the class-disjoint splits above). Every class with >= 2 items puts
    ``max(1, round(query_fraction * n))`` items (at most n - 1) into the query set and the rest
    into the gallery, so every query has at least one same-class gallery item. Singleton classes
    go to the gallery (they act as distractors). ``labels`` is the (N, 2) two-level array or a
    1-D class array. O(N log N).
    """
    classes = _classes_of(labels)
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
