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

    Not PML's ``MPerClassSampler(labels, m, batch_size)``: the second positional argument here is
    ``batch_size``; PML's ``m`` / ``length_before_new_iter`` keywords are refused with the
    equivalent (:func:`~.base.refuse_pml_keywords`).
    """

    def __init__(
        self,
        labels,
        batch_size: int,
        samples_per_class="all",
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        categories=None,
        *,
        m=None,
        length_before_new_iter=None,
    ):
        if categories is None and np.ndim(labels) == 1:
            categories = np.zeros(len(labels), dtype=np.int64)  # categories play no role here
        super().__init__(
            labels,
            batch_size,
            categories,
            samples_per_class,
            seed,
            num_replicas,
            rank,
            m=m,
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
