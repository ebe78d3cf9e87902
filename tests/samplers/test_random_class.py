import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pml_rank_plugins.samplers import RandomClassSampler

from .strategies import build_or_none, check_batch_invariants, two_level_labels


def build(labels, batch_size, **kwargs):
    """The sampler, or None when the label structure cannot serve this batch size."""
    return build_or_none(RandomClassSampler, labels, batch_size, "cannot fill a batch", **kwargs)


@settings(max_examples=50, deadline=None)
@given(labels=two_level_labels(), batch_size=st.integers(2, 20), cap=st.sampled_from(["all", 3]))
def test_exact_batches_and_epoch_length(labels, batch_size, cap):
    sampler = build(labels, batch_size, samples_per_class=cap)
    assume(sampler is not None)
    batches = list(sampler)
    classes, counts = np.unique(labels[:, 0], return_counts=True)
    usable = counts[counts >= 2].sum()
    assert len(batches) == len(sampler) == max(1, usable // batch_size)
    for batch in batches:
        check_batch_invariants(batch, labels, batch_size)


@settings(max_examples=30, deadline=None)
@given(labels=two_level_labels(), batch_size=st.integers(2, 10), replicas=st.integers(2, 3))
def test_shards_disjoint_equal_count(labels, batch_size, replicas):
    single = build(labels, batch_size)
    assume(single is not None)
    shards = [build(labels, batch_size, num_replicas=replicas, rank=r) for r in range(replicas)]
    lists = [s.epoch_batches(2) for s in shards]
    assert {len(lst) for lst in lists} == {math.ceil(len(single) / replicas)}
    interleaved = [lst[i] for i in range(len(lists[0])) for lst in lists]
    assert interleaved[: len(single)] == single.epoch_batches(2)


def test_one_dimensional_labels_and_reproducibility():
    classes = np.repeat(np.arange(30), 4)
    a, b = RandomClassSampler(classes, batch_size=10, seed=5), RandomClassSampler(
        classes, batch_size=10, seed=5
    )
    assert list(a) == list(b)
    assert a.epoch_batches(0) != a.epoch_batches(1)
    assert a.epoch_batches(0) != RandomClassSampler(classes, batch_size=10, seed=6).epoch_batches(0)


def test_batch_larger_than_dataset_raises():
    with pytest.raises(ValueError, match="cannot fill a batch of 50"):
        RandomClassSampler(np.repeat(np.arange(5), 3), batch_size=50)
