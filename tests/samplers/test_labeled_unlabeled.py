import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pml_rank_plugins.samplers import LabeledUnlabeledSampler

from .strategies import build_or_none, check_batch_invariants, two_level_labels


def build(labels, batch_size, **kwargs):
    """The sampler, or None when the label structure cannot serve this batch size."""
    return build_or_none(
        LabeledUnlabeledSampler,
        labels,
        batch_size,
        "cannot fill a half|no labeled category",
        **kwargs,
    )


@settings(max_examples=50, deadline=None)
@given(labels=two_level_labels(min_categories=1, unlabeled=True), half=st.integers(2, 8))
def test_half_one_labeled_category_half_unlabeled(labels, half):
    sampler = build(labels, 2 * half)
    assume(sampler is not None)
    batches = list(sampler)
    classes, counts = np.unique(labels[:, 0], return_counts=True)
    singletons = classes[counts < 2]
    in_usable = np.isin(labels[:, 1], sampler.categories) & ~np.isin(labels[:, 0], singletons)
    usable_labeled = int(in_usable.sum())
    assert len(batches) == len(sampler) == max(1, 2 * usable_labeled // (2 * half))
    for batch in batches:
        check_batch_invariants(batch, labels, 2 * half)
        cats = labels[batch, 1]
        assert (cats == -1).sum() == half
        assert len(set(cats[cats != -1].tolist())) == 1


def test_batches_apportioned_to_categories_by_size():
    # Category 0: 40 items, category 1: 20 items, unlabeled: 30 items; batch 10 -> 12 batches.
    classes = np.concatenate([np.repeat(np.arange(10), 4), np.repeat(np.arange(10, 15), 4)])
    categories = np.concatenate([np.zeros(40, int), np.ones(20, int)])
    classes = np.concatenate([classes, np.repeat(np.arange(15, 25), 3)])
    categories = np.concatenate([categories, -np.ones(30, int)])
    sampler = LabeledUnlabeledSampler(classes, batch_size=10, categories=categories)
    per_category = [int(c) for b in sampler for c in set(categories[b]) if c != -1]
    assert len(per_category) == 12
    assert per_category.count(0) == 8 and per_category.count(1) == 4


@pytest.mark.parametrize(
    "batch_size, message", [(7, "must be even"), (100, "unlabeled items .* cannot fill a half")]
)
def test_bad_arguments(batch_size, message):
    classes = np.repeat(np.arange(10), 3)
    categories = np.repeat([0, 0, 0, 0, 0, -1, -1, -1, -1, -1], 3)
    with pytest.raises(ValueError, match=message):
        LabeledUnlabeledSampler(classes, batch_size=batch_size, categories=categories)


def test_no_unlabeled_items_raises():
    classes = np.repeat(np.arange(10), 3)
    with pytest.raises(ValueError, match="unlabeled"):
        LabeledUnlabeledSampler(classes, batch_size=6, categories=classes % 2)
