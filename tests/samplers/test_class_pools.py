import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from pml_rank_plugins.samplers.class_pools import ClassPools, PoolCursor, fill_part


def labels_from_sizes(sizes, category=0):
    classes = np.repeat(np.arange(len(sizes)), sizes)
    return np.stack([classes, np.full(len(classes), category)], axis=1)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=12),
    size=st.integers(2, 40),
    cap=st.sampled_from(["all", 2, 3, 5]),
    seed=st.integers(0, 1000),
)
def test_fill_is_exact_whenever_pool_problem_says_feasible(sizes, size, cap, seed):
    labels = labels_from_sizes(sizes)
    pools = ClassPools(labels, cap)
    pool = pools.pool()
    if pools.pool_problem(pool, size) is not None:
        # Brute-force check that "infeasible" is honest: no assignment of 2..available items.
        avail = pools.available[pool]
        reachable = {0}
        for a in avail:
            reachable |= {r + t for r in reachable for t in range(2, a + 1)}
        assert size not in reachable
        return
    gen = torch.Generator().manual_seed(seed)
    cursor = PoolCursor(pool, gen)
    for _ in range(3):
        part = fill_part(pools, cursor, size, gen)
        assert len(part) == size and len(set(part.tolist())) == size
        classes, counts = np.unique(labels[part, 0], return_counts=True)
        assert counts.min() >= 2
        if cap != "all":
            assert counts.max() <= cap


def test_whole_classes_are_taken_when_they_fit():
    labels = labels_from_sizes([3, 3, 3, 3])
    pools = ClassPools(labels)
    gen = torch.Generator().manual_seed(0)
    part = fill_part(pools, PoolCursor(pools.pool(), gen), 9, gen)
    assert sorted(np.unique(labels[part, 0], return_counts=True)[1].tolist()) == [3, 3, 3]


def test_class_larger_than_part_is_subsampled():
    labels = labels_from_sizes([50])
    pools = ClassPools(labels)
    gen = torch.Generator().manual_seed(0)
    part = fill_part(pools, PoolCursor(pools.pool(), gen), 8, gen)
    assert len(set(part.tolist())) == 8


def test_odd_part_swaps_two_item_class_for_larger_one():
    # 2+2+2 = 6 and 7 needs a class with a third item: the only way is 2 + 2 + 3.
    labels = labels_from_sizes([2, 2, 2, 2, 3])
    pools = ClassPools(labels)
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        part = fill_part(pools, PoolCursor(pools.pool(), gen), 7, gen)
        assert sorted(np.unique(labels[part, 0], return_counts=True)[1].tolist()) == [2, 2, 3]


def test_pool_problem_messages():
    pools = ClassPools(labels_from_sizes([2, 2, 1]))
    assert "fewer than the 6 needed" in pools.pool_problem(pools.pool(), 6)
    assert "odd count" in pools.pool_problem(pools.pool(), 3)
    assert pools.num_singletons == 1


@pytest.mark.parametrize("bad", [1, 0, "some", 2.5, True])
def test_bad_samples_per_class(bad):
    with pytest.raises(ValueError, match="samples_per_class"):
        ClassPools(labels_from_sizes([2, 2]), bad)


def test_subsampled_class_items_are_drawn_uniformly_not_the_first_ones():
    # 10-item class, 2 items per part: every item must be drawn, each about equally often
    # (taking the first t items of a class would show items 0 and 1 only).
    labels = labels_from_sizes([10])
    pools = ClassPools(labels, samples_per_class=2)
    gen = torch.Generator().manual_seed(0)
    cursor = PoolCursor(pools.pool(), gen)
    draws = 2000
    counts = np.zeros(10, dtype=np.int64)
    for _ in range(draws):
        part = fill_part(pools, cursor, 2, gen)
        assert len(set(part.tolist())) == 2
        counts[part] += 1
    assert (counts > 0).all(), counts
    # Chi-square goodness of fit against "each item in 2 of 10 places": 9 degrees of freedom.
    expected = 2 * draws / 10
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < stats.chi2.ppf(0.999, df=9), (chi2, counts)


def test_epochs_of_a_capped_sampler_see_every_item():
    # The case: samples_per_class=2 on 10-item classes; 20 parts of 2 items per class
    # must reach (nearly) all items, not the same 2 of each class.
    labels = labels_from_sizes([10] * 8)
    pools = ClassPools(labels, samples_per_class=2)
    gen = torch.Generator().manual_seed(1)
    cursor = PoolCursor(pools.pool(), gen)
    seen = set()
    for _ in range(20 * 8):  # each class about 20 times
        seen.update(fill_part(pools, cursor, 2, gen).tolist())
    assert len(seen) >= 0.9 * len(labels), len(seen)
