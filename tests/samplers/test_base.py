"""Behaviour shared by every class-structured sampler (``samplers/base.py``)."""

import warnings

import numpy as np
import pytest
import torch

from pml_rank_plugins.data import encode_labels
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
    "category_hard": lambda **kw: CategoryHardSampler(
        two_level(), batch_size=8, batches_per_pair=1, **kw
    ),
    "random_class": lambda **kw: RandomClassSampler(two_level(), batch_size=8, **kw),
    "labeled_unlabeled": lambda **kw: LabeledUnlabeledSampler(vehicle_labels(), batch_size=8, **kw),
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
        RandomClassSampler(two_level(), batch_size=batch_size)


@pytest.mark.parametrize("kwargs", [dict(batches_per_pair=1.0), dict(categories_per_batch=2.0)])
def test_category_hard_counts_must_be_integers(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=rf"{name} must be an integer"):
        CategoryHardSampler(two_level(), batch_size=8, **kwargs)


@pytest.mark.parametrize("samples_per_class", [2.0, True, 1, "some"])
def test_samples_per_class_must_be_all_or_an_integer(samples_per_class):
    with pytest.raises(ValueError, match=r"samples_per_class must be"):
        RandomClassSampler(two_level(), batch_size=8, samples_per_class=samples_per_class)


# -- batches depend only on (seed, epoch), whatever the DataLoader does (issue 12.7) ------------
def loader_epochs(sampler, num_workers, num_epochs):
    # The dataset on the CPU whatever the default device: a forked loader worker cannot use
    # CUDA ("CUDA error: initialization error" under TEST_DEVICE=cuda), and a dataset's items
    # live on the host anyway (the sampler under test draws on the CPU by itself).
    data = torch.utils.data.TensorDataset(torch.arange(len(sampler.labels), device="cpu"))
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler, num_workers=num_workers)
    return [[b[0].tolist() for b in loader] for _ in range(num_epochs)]


@pytest.mark.parametrize("name", SAMPLERS)
def test_dataloader_workers_do_not_change_the_batches(name):
    # With num_workers > 0 the DataLoader calls iter() on the batch sampler twice per epoch; the
    # epoch used to advance on each call, so set_epoch(5) gave epoch 6's batches.
    sampler = build(name, seed=4)
    sampler.set_epoch(5)
    with_workers = loader_epochs(sampler, num_workers=2, num_epochs=2)
    assert sampler.epoch == 7
    want = [sampler.epoch_batches(5), sampler.epoch_batches(6)]
    assert with_workers == want
    plain = build(name, seed=4)
    plain.set_epoch(5)
    assert loader_epochs(plain, num_workers=0, num_epochs=2) == want


def test_an_unconsumed_iterator_does_not_use_up_an_epoch():
    sampler = build("random_class", seed=1)
    iter(sampler)  # created and dropped, as a DataLoader may do
    assert sampler.epoch == 0
    assert list(sampler) == sampler.epoch_batches(0)
    assert sampler.epoch == 1


@pytest.mark.parametrize("name", SAMPLERS)
def test_state_dict_resumes_exactly_through_a_worker_loader(name):
    sampler = build(name, seed=2)
    loader_epochs(sampler, num_workers=0, num_epochs=2)
    state = sampler.state_dict()
    assert state == {"seed": 2, "epoch": 2}
    resumed = build(name, seed=2)
    resumed.load_state_dict(state)
    assert loader_epochs(resumed, num_workers=2, num_epochs=1) == [sampler.epoch_batches(2)]


def test_load_state_dict_checks_its_input():
    sampler = build("random_class", seed=2)
    with pytest.raises(ValueError, match=r"epoch must be an integer >= 0, got 1.5"):
        sampler.load_state_dict({"seed": 2, "epoch": 1.5})
    with pytest.raises(ValueError, match=r"state_dict has keys \['epoch'\], expected"):
        sampler.load_state_dict({"epoch": 1})
    with pytest.raises(ValueError, match=r"seed 3, but this sampler.s seed is 2"):
        sampler.load_state_dict({"seed": 3, "epoch": 1})


@pytest.mark.parametrize("name", ["category_hard", "random_class", "labeled_unlabeled"])
def test_string_labels_name_encode_labels(name):
    # issue 50: a raw numpy TypeError ("ufunc 'remainder' not supported ...") before
    classes = np.repeat(np.array(["cat", "dog", "owl", "emu"]), 4)
    categories = np.repeat(np.array(["pet", "pet", "bird", "bird"]), 4)
    cls = {
        "category_hard": CategoryHardSampler,
        "random_class": RandomClassSampler,
        "labeled_unlabeled": LabeledUnlabeledSampler,
    }[name]
    with pytest.raises(TypeError, match="labels hold str values such as 'cat'.*encode_labels"):
        cls(classes, batch_size=4, categories=categories)
    codes, _ = encode_labels(classes)
    with pytest.raises(TypeError, match="categories hold str values such as 'pet'.*encode_labels"):
        cls(codes, batch_size=4, categories=categories)
    category_codes, category_names = encode_labels(categories)
    if name == "labeled_unlabeled":  # it needs unlabeled items (category -1): the birds
        category_codes[category_codes == category_names.index("bird")] = -1
    sampler = cls(codes, batch_size=4, categories=category_codes)
    assert len(sampler.epoch_batches(0)) > 0
