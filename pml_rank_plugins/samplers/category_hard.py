"""FastAP's category-hard minibatches (Cakir et al. CVPR 2019, supplementary sec. A)."""

from __future__ import annotations

import itertools

import torch

from ..functional.validation import check_int
from .base import ClassBatchSampler


class CategoryHardSampler(ClassBatchSampler):
    """Batches of ``categories_per_batch`` categories, ``batch_size / categories_per_batch`` each.

    One epoch visits every unordered combination of ``categories_per_batch`` distinct categories
    (pairs by default), ``batches_per_pair`` batches each, in shuffled order:
    ``len = C(num_categories, categories_per_batch) * batches_per_pair`` (e.g. Stanford Online
    Products: C(12, 2) * 5 = 330). Each part is filled with whole classes of its category in
    reshuffled order (see :mod:`.class_pools` for the exact-size policy: overshooting classes are
    subsampled, every class keeps >= 2 items, never a short batch).

    Categories that cannot fill a part (too few items in classes of >= 2 items, or an odd part
    made only of two-item classes) and unlabeled items (category -1) are excluded with a warning
    naming them; fewer than ``categories_per_batch`` usable categories is a ``ValueError``.

    Everything after ``labels`` is keyword-only: PML's ``MPerClassSampler(labels, 4)`` habit is a
    ``TypeError`` naming ``batch_size=4`` / ``samples_per_class=4``, never a batch of 4.

    Args:
        labels: ``(N, 2)`` [class, category] array, or the 1-D class array with ``categories``.
        m: PML ``MPerClassSampler``'s second argument, refused (see ``length_before_new_iter``).
        batch_size: items per batch (per rank), divisible by ``categories_per_batch``.
        batches_per_pair: batches per combination of categories per epoch.
        categories_per_batch: categories in each batch (2 in the paper).
        samples_per_class: ``"all"`` (paper) or the most items a class contributes to a batch.
        seed, num_replicas, rank: see :class:`~.base.ClassBatchSampler`.
        categories: optional 1-D category array when ``labels`` is 1-D.
        length_before_new_iter: PML ``MPerClassSampler`` keyword; it and ``m`` are refused with
            a ``TypeError`` naming the equivalent (:func:`~.base.refuse_pml_keywords`).
    """

    def __init__(
        self,
        labels,
        m=None,
        *,
        batch_size: int | None = None,
        batches_per_pair: int = 5,
        categories_per_batch: int = 2,
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
        categories_per_batch = check_int(categories_per_batch, "categories_per_batch", minimum=2)
        batches_per_pair = check_int(batches_per_pair, "batches_per_pair", minimum=1)
        self.part_size = self._part_size(
            categories_per_batch,
            f"batch_size ({self.batch_size}) must be divisible by categories_per_batch "
            f"({categories_per_batch})",
            "each category's part",
        )
        self.batches_per_pair = batches_per_pair
        self.categories_per_batch = categories_per_batch
        usable = self._add_category_pools(self.part_size)
        if len(usable) < categories_per_batch:
            raise ValueError(
                f"need >= {categories_per_batch} categories able to fill {self.part_size} items "
                f"each, found {len(usable)} (the others were excluded with a warning)"
            )
        self.combinations = list(itertools.combinations(self.categories, categories_per_batch))

    def _num_epoch_batches(self) -> int:
        return len(self.combinations) * self.batches_per_pair

    def _epoch_specs(self, generator: torch.Generator) -> list[tuple]:
        specs = [
            tuple((category, self.part_size) for category in combination)
            for combination in self.combinations
            for _ in range(self.batches_per_pair)
        ]
        return self._shuffled(specs, generator)
