import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pml_rank_plugins.samplers import CategoryHardSampler

from .strategies import build_or_none, check_batch_invariants, two_level_labels

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def build(labels, batch_size, **kwargs):
    """The sampler, or None when the label structure cannot serve this batch size."""
    return build_or_none(
        CategoryHardSampler, labels, batch_size, "categories able to fill", **kwargs
    )


@SETTINGS
@given(labels=two_level_labels(), part=st.integers(2, 8), k=st.sampled_from([2, 3]))
def test_batches_are_exact_category_hard_and_duplicate_free(labels, part, k):
    sampler = build(labels, part * k, batches_per_pair=2, categories_per_batch=k)
    assume(sampler is not None)
    batches = list(sampler)
    assert len(batches) == len(sampler) == math.comb(len(sampler.categories), k) * 2
    for batch in batches:
        check_batch_invariants(batch, labels, part * k)
        categories, counts = np.unique(labels[batch, 1], return_counts=True)
        assert len(categories) == k and (counts == part).all()
        assert set(categories.tolist()) <= set(sampler.categories)


@SETTINGS
@given(labels=two_level_labels(), part=st.integers(2, 6))
def test_every_category_pair_gets_batches_per_pair_batches(labels, part):
    sampler = build(labels, 2 * part, batches_per_pair=3)
    assume(sampler is not None)
    seen = {}
    for batch in sampler:
        pair = tuple(sorted(set(labels[batch, 1].tolist())))
        seen[pair] = seen.get(pair, 0) + 1
    assert seen == {pair: 3 for pair in itertools.combinations(sampler.categories, 2)}


@SETTINGS
@given(labels=two_level_labels(), part=st.integers(2, 6), seed=st.integers(0, 100))
def test_same_seed_same_batches_and_epochs_differ(labels, part, seed):
    a = build(labels, 2 * part, seed=seed)
    assume(a is not None)
    b = build(labels, 2 * part, seed=seed)
    assert list(a) == list(b)  # epoch 0 for both
    epoch1 = list(a)  # the second iteration is epoch 1
    b.set_epoch(1)
    assert list(b) == epoch1
    assume(len(labels) > 2 * part + 4)  # tiny structures may have a single possible epoch
    different = any(a.epoch_batches(0) != a.epoch_batches(e) for e in range(1, 6))
    assert different


@SETTINGS
@given(labels=two_level_labels(), part=st.integers(2, 5), replicas=st.integers(2, 4))
def test_shards_are_disjoint_equal_and_cover_the_epoch(labels, part, replicas):
    single = build(labels, 2 * part)
    assume(single is not None)
    shards = [build(labels, 2 * part, num_replicas=replicas, rank=r) for r in range(replicas)]
    lists = [s.epoch_batches(0) for s in shards]
    assert all(
        len(s) == len(lst) == math.ceil(len(single) / replicas) for s, lst in zip(shards, lists)
    )
    whole = single.epoch_batches(0)
    # Interleaving the shards gives back the single-process epoch (then padding batches).
    interleaved = [lst[i] for i in range(len(lists[0])) for lst in lists]
    assert interleaved[: len(whole)] == whole
    assert len(interleaved) - len(whole) < replicas


def test_set_epoch_is_reproducible_and_independent_of_global_rng():
    labels = np.stack([np.repeat(np.arange(40), 4), np.repeat(np.arange(40) % 4, 4)], axis=1)
    sampler = CategoryHardSampler(labels, batch_size=16, batches_per_pair=2)
    torch.manual_seed(0)
    np.random.seed(0)
    sampler.set_epoch(3)
    first = list(sampler)
    torch.manual_seed(123)
    np.random.seed(123)
    sampler.set_epoch(3)
    assert list(sampler) == first
    assert sampler.epoch == 4


def test_two_one_dimensional_arrays_accepted():
    classes = np.repeat(np.arange(12), 3)
    sampler = CategoryHardSampler(classes, batch_size=6, categories=classes % 3)
    assert all(len(b) == 6 for b in sampler)


def test_dataloader_batch_sampler_yields_exact_batches():
    labels = np.stack([np.repeat(np.arange(20), 3), np.repeat(np.arange(20) % 4, 3)], axis=1)
    sampler = CategoryHardSampler(labels, batch_size=12, batches_per_pair=1)
    assert isinstance(sampler, torch.utils.data.BatchSampler)
    data = torch.utils.data.TensorDataset(torch.arange(len(labels)))
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)
    got = [b[0].tolist() for b in loader]
    assert len(got) == len(loader) == 6 and all(len(b) == 12 for b in got)


@pytest.mark.filterwarnings("ignore:category")
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=9), "divisible by categories_per_batch"),
        (dict(batch_size=8, categories_per_batch=1), "categories_per_batch must be"),
        (dict(batch_size=8, batches_per_pair=0), "batches_per_pair"),
        (dict(batch_size=2), "part must hold >= 2"),
        (dict(batch_size=1), "batch_size must be an integer >= 2"),
        (dict(batch_size=8, num_replicas=2, rank=2), r"rank must be an integer in \[0, 1\]"),
        (dict(batch_size=400), "need >= 2 categories able to fill 200"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, message):
    labels = np.stack([np.repeat(np.arange(20), 3), np.repeat(np.arange(20) % 4, 3)], axis=1)
    with pytest.raises(ValueError, match=message):
        CategoryHardSampler(labels, **kwargs)


def test_small_category_excluded_with_warning_naming_it():
    classes = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4])
    categories = np.array([0] * 6 + [1] * 6 + [7] * 2)
    with pytest.warns(UserWarning, match="category 7 excluded"):
        sampler = CategoryHardSampler(classes, batch_size=8, categories=categories)
    assert sampler.categories == [0, 1]
    # recorded for `pml-rank check`'s summary line (issue 50): 2 items, a part needs 4
    assert sampler.candidates == {"category": 3}
    assert sampler.excluded == [
        ("category", 7, "has 2 usable items in classes of >= 2, fewer than the 4 needed")
    ]


def test_single_item_classes_are_recorded():
    classes = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 5])  # classes 4 and 5: one item
    categories = np.array([0] * 6 + [1] * 6 + [1, 1])
    with pytest.warns(UserWarning, match="2 class"):
        sampler = CategoryHardSampler(classes, batch_size=6, categories=categories)
    assert sampler.excluded == [
        ("class", 2, "have a single item and are never sampled (a query needs a positive)")
    ]


def test_unlabeled_items_are_not_a_category():
    classes = np.repeat(np.arange(9), 3)
    categories = np.repeat([0, 0, 0, 1, 1, 1, -1, -1, -1], 3)
    sampler = CategoryHardSampler(classes, batch_size=8, categories=categories)
    assert sampler.categories == [0, 1]
    assert all((labels_cat >= 0).all() for labels_cat in [categories[b] for b in sampler])
