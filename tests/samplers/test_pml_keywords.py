"""PML ``MPerClassSampler(labels, m, batch_size=None, length_before_new_iter=100000)`` arguments
on our samplers (issue 21, build item 1; issue 29, item 5): same meaning accepted, the others
refused with a ``TypeError`` naming the equivalent -- in particular PML's positional ``m`` habit,
``CategoryHardSampler(labels, 4)``, which once silently meant ``batch_size=4``."""

import inspect

import numpy as np
import pytest
from pytorch_metric_learning.samplers import MPerClassSampler

from pml_rank_plugins.samplers import (
    CategoryHardSampler,
    LabeledUnlabeledSampler,
    RandomClassSampler,
)

from .test_base import SAMPLERS, build, two_level, vehicle_labels

CLASSES = {
    CategoryHardSampler: "category_hard",
    RandomClassSampler: "random_class",
    LabeledUnlabeledSampler: "labeled_unlabeled",
}
LABELS = {
    CategoryHardSampler: two_level,
    RandomClassSampler: two_level,
    LabeledUnlabeledSampler: vehicle_labels,
}


@pytest.mark.parametrize("name", SAMPLERS)
def test_m_is_refused_naming_samples_per_class(name):
    with pytest.raises(TypeError, match=r"has no m: .*samples_per_class=4"):
        build(name, m=4)


@pytest.mark.parametrize("name", SAMPLERS)
def test_length_before_new_iter_is_refused_naming_the_epoch_length(name):
    with pytest.raises(TypeError, match=r"has no length_before_new_iter .*len\(sampler\)"):
        build(name, length_before_new_iter=1000)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("m", [4, np.int64(4)])
def test_pml_positional_m_is_refused_naming_both_fixes(cls, m):
    # PML's MPerClassSampler(labels, 4) habit: never a batch of 4, with or without batch_size.
    name = cls.__name__
    for call in (lambda: cls(LABELS[cls](), m), lambda: cls(LABELS[cls](), m, batch_size=8)):
        with pytest.raises(TypeError) as info:
            call()
        message = str(info.value)
        assert message.startswith(f"{name}(labels, 4)"), message
        assert "batch_size=4 by keyword" in message and "samples_per_class=4" in message


@pytest.mark.parametrize("cls", CLASSES)
def test_every_argument_after_labels_is_keyword_only(cls):
    params = list(inspect.signature(cls).parameters.values())
    assert [p.name for p in params[:2]] == ["labels", "m"]
    assert all(p.kind is p.KEYWORD_ONLY for p in params[2:]), [str(p) for p in params]
    # A third positional argument is Python's own TypeError, not a silent meaning either.
    with pytest.raises(TypeError, match="positional argument"):
        cls(LABELS[cls](), None, 8)


@pytest.mark.parametrize("cls", CLASSES)
def test_labels_first_and_batch_size_keyword_mean_what_they_mean_in_pml(cls):
    ours = list(inspect.signature(cls).parameters)
    pml = list(inspect.signature(MPerClassSampler).parameters)
    assert ours[:2] == pml[:2] == ["labels", "m"]
    assert "batch_size" in ours and "batch_size" in pml
    sampler = build(CLASSES[cls])
    assert all(len(batch) == sampler.batch_size == 8 for batch in sampler)


@pytest.mark.parametrize("cls", CLASSES)
def test_batch_size_is_required(cls):
    with pytest.raises(TypeError, match=rf"{cls.__name__} needs batch_size="):
        cls(LABELS[cls]())
