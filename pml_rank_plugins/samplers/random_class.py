"""FastAP's "random" baseline: batches of whole classes drawn from the whole dataset."""

from __future__ import annotations

import numpy as np
import torch

from .base import ClassBatchSampler

_ALL = "all classes"


class RandomClassSampler(ClassBatchSampler):
    """Batches of exactly ``batch_size`` items from randomly chosen whole classes (any category).

    An epoch has ``floor(U / batch_size)`` batches (at least 1), ``U`` = items in classes of >= 2
    items, so about every item is seen once. Same guarantees as :class:`CategoryHardSampler`
    (exact size, >= 2 items per class present, no duplicates); categories are ignored.

    Not PML's ``MPerClassSampler(labels, m, batch_size)``: everything after ``labels`` is
    keyword-only (``RandomClassSampler(labels, batch_size=16)``); PML's ``m`` (also in the second
    place: ``RandomClassSampler(labels, 4)``) and ``length_before_new_iter`` are refused with a
    ``TypeError`` naming the equivalent (:func:`~.base.refuse_pml_keywords`).
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
        if categories is None and np.ndim(labels) == 1:
            categories = np.zeros(len(labels), dtype=np.int64)  # categories play no role here
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
        members = self.pools.pool()
        problem = self.pools.pool_problem(members, self.batch_size)
        if problem is not None:
            raise ValueError(f"the dataset cannot fill a batch of {self.batch_size}: it {problem}")
        self._add_pool(_ALL, members)
        self.usable_items = int(self.pools.counts[members].sum())

    def _num_epoch_batches(self) -> int:
        return max(1, self.usable_items // self.batch_size)

    def _epoch_specs(self, generator: torch.Generator) -> list[tuple]:
        return [((_ALL, self.batch_size),)] * self._num_epoch_batches()
