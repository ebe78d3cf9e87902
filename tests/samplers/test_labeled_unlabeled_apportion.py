"""LabeledUnlabeledSampler gives each labeled category a number of batches proportional to its
size by the largest remainder (Hamilton) method: the floors of the quotas, then one more batch
each to the categories with the largest fractional parts."""

from __future__ import annotations

import numpy as np

from pml_rank_plugins.samplers import LabeledUnlabeledSampler


def test_batches_left_over_by_the_floors_go_to_the_largest_remainders():
    # Labeled items by category: 28, 16, 12 (classes of 4); unlabeled: 30 (classes of 3).
    # Batch 10 (half 5): 2 * 56 // 10 = 11 batches; quotas 11 * (28, 16, 12) / 56 =
    # (5.5, 3.14, 2.36): floors (5, 3, 2) leave 1 batch, to the largest remainder, category 0.
    sizes = {0: 28, 1: 16, 2: 12}
    classes, categories, next_class = [], [], 0
    for cat, n in sizes.items():
        for _ in range(n // 4):
            classes += [next_class] * 4
            categories += [cat] * 4
            next_class += 1
    for _ in range(10):
        classes += [next_class] * 3
        categories += [-1] * 3
        next_class += 1
    classes, categories = np.array(classes), np.array(categories)
    quotas = 11 * np.array(list(sizes.values())) / 56
    assert np.floor(quotas).sum() == 10 and np.argmax(quotas % 1) == 0  # the construction
    sampler = LabeledUnlabeledSampler(classes, batch_size=10, categories=categories)
    per_category = [int(c) for b in sampler for c in set(categories[b]) if c != -1]
    assert len(per_category) == len(sampler) == 11
    assert [per_category.count(c) for c in sizes] == [6, 3, 2]
