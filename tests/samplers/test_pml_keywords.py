"""PML ``MPerClassSampler(labels, m, batch_size=None, length_before_new_iter=100000)`` keywords
on our samplers (issue 21, build item 1): same meaning accepted, the others refused with the
equivalent."""

import inspect

import pytest
from pytorch_metric_learning.samplers import MPerClassSampler

from pml_rank_plugins.samplers import (
    CategoryHardSampler,
    LabeledUnlabeledSampler,
    RandomClassSampler,
)

from .test_base import SAMPLERS, build


@pytest.mark.parametrize("name", SAMPLERS)
def test_m_is_refused_naming_samples_per_class(name):
    with pytest.raises(ValueError, match=r"has no m .*samples_per_class=4"):
        build(name, m=4)


@pytest.mark.parametrize("name", SAMPLERS)
def test_length_before_new_iter_is_refused_naming_the_epoch_length(name):
    with pytest.raises(ValueError, match=r"has no length_before_new_iter .*len\(sampler\)"):
        build(name, length_before_new_iter=1000)


@pytest.mark.parametrize("cls", [CategoryHardSampler, RandomClassSampler, LabeledUnlabeledSampler])
def test_labels_first_and_batch_size_keyword_mean_what_they_mean_in_pml(cls):
    ours = list(inspect.signature(cls).parameters)
    pml = list(inspect.signature(MPerClassSampler).parameters)
    assert ours[0] == pml[0] == "labels"
    assert "batch_size" in ours and "batch_size" in pml
    sampler = build(
        {
            CategoryHardSampler: "category_hard",
            RandomClassSampler: "random_class",
            LabeledUnlabeledSampler: "labeled_unlabeled",
        }[cls]
    )
    assert all(len(batch) == sampler.batch_size == 8 for batch in sampler)
