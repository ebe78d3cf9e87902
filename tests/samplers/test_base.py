"""Behaviour shared by every class-structured sampler (``samplers/base.py``)."""

import warnings

import numpy as np
import pytest

from pml_rank_plugins.samplers import (
    CategoryHardSampler,
    LabeledUnlabeledSampler,
    RandomClassSampler,
)


def two_level(num_classes=24, per_class=3, num_categories=4):
    classes = np.repeat(np.arange(num_classes), per_class)
    return np.stack([classes, classes % num_categories], axis=1)


def vehicle_labels():
    labels = two_level(num_classes=24, per_class=3, num_categories=4)
    labels[labels[:, 0] >= 12, 1] = -1  # half the classes have no model label
    return labels


SAMPLERS = {
    "category_hard": lambda **kw: CategoryHardSampler(two_level(), 8, batches_per_pair=1, **kw),
    "random_class": lambda **kw: RandomClassSampler(two_level(), 8, **kw),
    "labeled_unlabeled": lambda **kw: LabeledUnlabeledSampler(vehicle_labels(), 8, **kw),
}


def build(name, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SAMPLERS[name](**kwargs)


# -- clear errors at the call (issue 12.14) ---------------------------------------------------
@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("seed", [-1, 1.5, True, "0"])
def test_bad_seed_is_refused_at_construction(name, seed):
    with pytest.raises(ValueError, match=r"seed must be an integer >= 0, got"):
        build(name, seed=seed)


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("epoch", [1.7, -1, True, "2"])
def test_bad_epoch_is_refused_by_set_epoch(name, epoch):
    sampler = build(name)
    with pytest.raises(ValueError, match=r"epoch must be an integer >= 0, got"):
        sampler.set_epoch(epoch)


@pytest.mark.parametrize("name", SAMPLERS)
def test_numpy_integers_are_accepted(name):
    sampler = build(name, seed=np.int64(3), num_replicas=np.int32(2), rank=np.int64(1))
    sampler.set_epoch(np.int64(2))
    assert type(sampler.seed) is int and type(sampler.epoch) is int
    assert sampler.epoch_batches(2) == build(name, seed=3, num_replicas=2, rank=1).epoch_batches(2)


@pytest.mark.parametrize("batch_size", [8.0, True, 1])
def test_bad_batch_size(batch_size):
    with pytest.raises(ValueError, match=r"batch_size must be an integer >= 2"):
        RandomClassSampler(two_level(), batch_size)


@pytest.mark.parametrize("kwargs", [dict(batches_per_pair=1.0), dict(categories_per_batch=2.0)])
def test_category_hard_counts_must_be_integers(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=rf"{name} must be an integer"):
        CategoryHardSampler(two_level(), 8, **kwargs)


@pytest.mark.parametrize("samples_per_class", [2.0, True, 1, "some"])
def test_samples_per_class_must_be_all_or_an_integer(samples_per_class):
    with pytest.raises(ValueError, match=r"samples_per_class must be"):
        RandomClassSampler(two_level(), 8, samples_per_class=samples_per_class)
