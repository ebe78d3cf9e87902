"""Class pools and the exact "fill k items with whole classes" routine shared by all samplers.

A *pool* is a set of classes (all classes of one category, all unlabeled classes, or every class).
Filling a part of a batch from a pool follows FastAP's hard-mining recipe (supplementary sec. A):
classes are visited in a freshly shuffled order and each chosen class contributes all its items
(or at most ``samples_per_class``). The part always gets *exactly* ``size`` items:

* classes are added until their items reach ``size``; the overshoot is removed by subsampling the
  classes added last (each keeps at least 2 items), so a class larger than the part is subsampled;
* every chosen class keeps >= 2 items (so every query has a positive); classes with a single item
  are never sampled;
* no index twice: a class is chosen at most once per part and its items are drawn without
  replacement; different parts use disjoint pools.

When ``size`` is odd and only two-item classes have been chosen, a two-item class is swapped for the
next class with >= 3 items, which always exists when ``ClassPools.pool_problem`` returned ``None``.
"""

from __future__ import annotations

import numpy as np
import torch

from ..data.labels import CATEGORY, CLASS
from ..functional.validation import check_int


class ClassPools:
    """Per-class item lists of a two-level label array, precomputed once. O(N log N).

    Attributes:
        class_items: list of int64 arrays, the dataset indices of each class (dense class id).
        class_category: ``(C,)`` category of each dense class.
        available: ``(C,)`` items a class can contribute to one part,
            ``min(count, samples_per_class)``.
    """

    def __init__(self, labels: np.ndarray, samples_per_class="all"):
        if not (isinstance(samples_per_class, str) and samples_per_class == "all"):
            try:
                samples_per_class = check_int(samples_per_class, "samples_per_class", minimum=2)
            except ValueError:
                raise ValueError(
                    'samples_per_class must be "all" or an integer >= 2 (so every query has a '
                    f"positive), got {samples_per_class!r}"
                ) from None
        order = np.argsort(labels[:, CLASS], kind="stable")
        classes, starts, counts = np.unique(
            labels[order, CLASS], return_index=True, return_counts=True
        )
        self.class_items = np.split(order, starts[1:]) if len(order) else []
        self.class_ids = classes
        self.class_category = labels[order[starts], CATEGORY] if len(order) else np.zeros(0, int)
        self.counts = counts
        cap = counts if samples_per_class == "all" else np.minimum(counts, samples_per_class)
        self.available = cap
        self.num_singletons = int((counts < 2).sum())

    def pool(self, category=None) -> np.ndarray:
        """Dense ids of usable classes (>= 2 items), of one category or of all when ``None``."""
        usable = self.counts >= 2
        if category is not None:
            usable &= self.class_category == category
        return np.flatnonzero(usable)

    def pool_problem(self, pool: np.ndarray, size: int) -> str | None:
        """Why ``pool`` cannot fill ``size`` items, or ``None`` when every fill succeeds."""
        total = int(self.available[pool].sum())
        if total < size:
            return f"has {total} usable items in classes of >= 2, fewer than the {size} needed"
        if size % 2 and not (self.available[pool] >= 3).any():
            return f"has only two-item classes, which cannot fill an odd count ({size})"
        return None


class PoolCursor:
    """Walks a pool's classes in shuffled order, reshuffling whenever the order is used up."""

    def __init__(self, pool: np.ndarray, generator: torch.Generator):
        self.pool = pool
        self.generator = generator
        self._reshuffle()

    def _reshuffle(self) -> None:
        order = torch.randperm(len(self.pool), generator=self.generator, device="cpu")
        self.order = self.pool[order.numpy()]
        self.position = 0

    def next_class(self) -> int:
        if self.position == len(self.order):
            self._reshuffle()
        self.position += 1
        return int(self.order[self.position - 1])


def fill_part(
    pools: ClassPools, cursor: PoolCursor, size: int, generator: torch.Generator
) -> np.ndarray:
    """Exactly ``size`` dataset indices from whole classes of ``cursor``'s pool (module docstring).

    O(size + classes visited) per call; the pool must pass :meth:`ClassPools.pool_problem`.
    """
    available = pools.available
    chosen: list[int] = []
    seen: set[int] = set()
    total = 0
    # The cursor may reshuffle mid-part; stop once every class of the pool has been considered.
    while total < size and len(seen) < len(cursor.pool):
        k = cursor.next_class()
        if k in seen:
            continue
        seen.add(k)
        if 2 * (len(chosen) + 1) > size:
            # Only reachable for odd sizes with all chosen classes of two items: swap one of them
            # for a class with a third item.
            if available[k] < 3:
                continue
            chosen.pop()
            total -= 2
        chosen.append(k)
        total += int(available[k])
    if total < size:
        raise RuntimeError(f"pool cannot fill {size} items; pool_problem() should have said why")
    take = available[chosen].astype(np.int64)
    excess = total - size
    for j in range(len(chosen) - 1, -1, -1):
        if excess == 0:
            break
        cut = min(excess, int(take[j]) - 2)
        take[j] -= cut
        excess -= cut
    parts = []
    for k, t in zip(chosen, take):
        items = pools.class_items[k]
        if t < len(items):
            items = items[torch.randperm(len(items), generator=generator, device="cpu")[:t].numpy()]
        parts.append(items)
    return np.concatenate(parts)
