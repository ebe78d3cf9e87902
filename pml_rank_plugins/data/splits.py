"""Class-disjoint splits: no class appears in two parts (the zero-shot retrieval protocol)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .labels import CLASS, as_two_level


class LabeledSubset(torch.utils.data.Subset):
    """A ``Subset`` that keeps the two-level ``labels`` of its items (``(len, 2)`` int64)."""

    def __init__(self, dataset, indices):
        indices = np.asarray(indices, dtype=np.int64)
        super().__init__(dataset, indices.tolist())
        self.labels = np.asarray(dataset.labels)[indices]


def _classes(labels) -> np.ndarray:
    return as_two_level(labels)[:, CLASS]


def class_disjoint_split(
    labels, fractions: Sequence[float] = (0.5, 0.5), seed: int = 0
) -> tuple[np.ndarray, ...]:
    """Split item indices into ``len(fractions)`` class-disjoint parts.

    Classes are shuffled with ``seed`` and cut by the cumulative ``fractions`` of the number of
    classes (rounded; every part gets at least one class). Returns sorted index arrays. O(N log N).
    """
    fractions = np.asarray(fractions, dtype=float)
    if fractions.ndim != 1 or len(fractions) < 1 or (fractions <= 0).any():
        raise ValueError(f"fractions must be positive numbers, got {fractions.tolist()}")
    if not np.isclose(fractions.sum(), 1.0):
        raise ValueError(f"fractions must sum to 1, got {fractions.sum():g}")
    classes = _classes(labels)
    unique = np.unique(classes)
    if len(unique) < len(fractions):
        raise ValueError(f"{len(unique)} classes cannot fill {len(fractions)} class-disjoint parts")
    order = np.random.default_rng(seed).permutation(unique)
    cuts = np.round(np.cumsum(fractions)[:-1] * len(unique)).astype(int)
    cuts = np.clip(cuts, np.arange(1, len(cuts) + 1), len(unique) - np.arange(len(cuts), 0, -1))
    return tuple(np.flatnonzero(np.isin(classes, part)) for part in np.split(order, cuts))


def class_disjoint_kfold(
    labels, num_folds: int = 4, seed: int | None = 0
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``num_folds`` (train, val) index pairs; the classes are split into ``num_folds`` groups
    (shuffled with ``seed``; in class-id order when ``seed`` is None) and each group is the
    validation set once."""
    classes = _classes(labels)
    unique = np.unique(classes)
    if num_folds < 2 or num_folds > len(unique):
        raise ValueError(f"num_folds must be in [2, {len(unique)}], got {num_folds}")
    order = unique if seed is None else np.random.default_rng(seed).permutation(unique)
    groups = np.array_split(order, num_folds)
    folds = []
    for group in groups:
        val = np.isin(classes, group)
        folds.append((np.flatnonzero(~val), np.flatnonzero(val)))
    return folds


def mlrc_protocol(labels, num_folds: int = 4):
    """ "A Metric Learning Reality Check" (Musgrave et al. 2020): the first half of the classes
    (by class id) is train/val with ``num_folds`` class-disjoint folds in class order, the second
    half is the test set. Returns ``(folds, test_indices)``; fold indices index the dataset."""
    classes = _classes(labels)
    unique = np.unique(classes)
    trainval = np.isin(classes, unique[: len(unique) // 2])
    trainval_idx = np.flatnonzero(trainval)
    folds = [
        (trainval_idx[train], trainval_idx[val])
        for train, val in class_disjoint_kfold(
            np.asarray(as_two_level(labels))[trainval_idx], num_folds, seed=None
        )
    ]
    return folds, np.flatnonzero(~trainval)
