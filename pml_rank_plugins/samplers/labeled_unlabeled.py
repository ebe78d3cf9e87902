"""FastAP's PKU VehicleID batches: half one labeled category, half unlabeled classes."""

from __future__ import annotations

import numpy as np
import torch

from ..data.labels import UNLABELED
from .base import ClassBatchSampler

_UNLABELED_POOL = "unlabeled"


class LabeledUnlabeledSampler(ClassBatchSampler):
    """Each batch: ``batch_size / 2`` items of one labeled category (vehicle model) and
    ``batch_size / 2`` items of random classes whose category is -1 (no model label).

    Epoch length ``floor(sum_c 2 N_c / batch_size)`` over usable labeled categories (``N_c`` their
    item counts); the batches are apportioned to categories in proportion to ``N_c`` (largest
    remainder) and shuffled. Labeled categories that cannot fill a half are excluded with a warning
    naming them; no usable labeled category, or unlabeled items that cannot fill a half, is a
    ``ValueError``. Everything after ``labels`` is keyword-only (``batch_size=``); PML
    ``MPerClassSampler``'s ``m`` (also in the second place) and ``length_before_new_iter`` are
    refused with a ``TypeError`` naming the equivalent (:func:`~.base.refuse_pml_keywords`).
    """

    def __init__(
        self,
        labels,
        m=None,
        *,
        batch_size: int | None = None,
        samples_per_class="all",
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        categories=None,
        length_before_new_iter=None,
    ):
        super().__init__(
            labels,
            m,
            batch_size=batch_size,
            categories=categories,
            samples_per_class=samples_per_class,
            seed=seed,
            num_replicas=num_replicas,
            rank=rank,
            length_before_new_iter=length_before_new_iter,
        )
        self.part_size = self._part_size(
            2, f"batch_size must be even (two halves), got {self.batch_size}", "each half"
        )
        unlabeled = self.pools.pool(UNLABELED)
        problem = self.pools.pool_problem(unlabeled, self.part_size)
        if problem is not None:
            raise ValueError(
                f"the unlabeled items (category -1) cannot fill a half: they {problem}"
            )
        self._add_pool(_UNLABELED_POOL, unlabeled)
        usable = self._add_category_pools(self.part_size)
        if not usable:
            raise ValueError(f"no labeled category can fill a half of {self.part_size} items")
        sizes = np.array([self.pools.counts[usable[c]].sum() for c in self.categories], float)
        self.batches_per_category = _apportion(sizes, int(2 * sizes.sum() // self.batch_size))

    def _num_epoch_batches(self) -> int:
        return max(1, int(self.batches_per_category.sum()))

    def _epoch_specs(self, generator: torch.Generator) -> list[tuple]:
        specs = [
            ((category, self.part_size), (_UNLABELED_POOL, self.part_size))
            for category, count in zip(self.categories, self.batches_per_category)
            for _ in range(count)
        ]
        if not specs:  # fewer labeled items than half a batch: one batch of the largest category
            largest = self.categories[int(np.argmax(self.batches_per_category))]
            specs = [((largest, self.part_size), (_UNLABELED_POOL, self.part_size))]
        return self._shuffled(specs, generator)


def _apportion(weights: np.ndarray, total: int) -> np.ndarray:
    """Split ``total`` into integers proportional to ``weights`` (largest remainder method)."""
    quotas = weights / weights.sum() * total
    counts = np.floor(quotas).astype(np.int64)
    remainder = total - counts.sum()
    counts[np.argsort(-(quotas - counts), kind="stable")[:remainder]] += 1
    return counts
