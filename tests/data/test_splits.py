import numpy as np
import pytest
import torch

from pml_rank_plugins.data import (
    LabeledSubset,
    class_disjoint_kfold,
    class_disjoint_split,
    mlrc_protocol,
)

LABELS = np.stack([np.repeat(np.arange(20), 3), np.repeat(np.arange(20) % 4, 3)], axis=1)


def classes_of(indices):
    return set(LABELS[indices, 0].tolist())


def test_split_is_class_disjoint_complete_and_deterministic():
    parts = class_disjoint_split(LABELS, (0.5, 0.25, 0.25), seed=3)
    assert [len(classes_of(p)) for p in parts] == [10, 5, 5]
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(LABELS)))
    for i in range(3):
        for j in range(i + 1, 3):
            assert not classes_of(parts[i]) & classes_of(parts[j])
    again = class_disjoint_split(LABELS, (0.5, 0.25, 0.25), seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = class_disjoint_split(LABELS, (0.5, 0.25, 0.25), seed=4)
    assert not np.array_equal(parts[0], other[0])


@pytest.mark.parametrize(
    "fractions, message",
    [((0.5, 0.6), "sum to 1"), ((1.5, -0.5), "positive"), ((0.05,) * 20 + (0.0,), "positive")],
)
def test_bad_fractions(fractions, message):
    with pytest.raises(ValueError, match=message):
        class_disjoint_split(LABELS, fractions)


def test_too_many_parts():
    with pytest.raises(ValueError, match="cannot fill"):
        class_disjoint_split(LABELS[:6], (0.25, 0.25, 0.25, 0.25))


def test_kfold_every_class_validated_once():
    folds = class_disjoint_kfold(LABELS, num_folds=4, seed=0)
    seen = []
    for train, val in folds:
        assert not classes_of(train) & classes_of(val)
        assert len(train) + len(val) == len(LABELS)
        seen += sorted(classes_of(val))
    assert sorted(seen) == list(range(20))
    with pytest.raises(ValueError, match="num_folds"):
        class_disjoint_kfold(LABELS, num_folds=1)


def test_mlrc_protocol_first_half_folds_second_half_test():
    folds, test = mlrc_protocol(LABELS, num_folds=4)
    assert classes_of(test) == set(range(10, 20))
    assert [sorted(classes_of(val)) for _, val in folds] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    for train, val in folds:
        assert classes_of(train) | classes_of(val) == set(range(10))


def test_labeled_subset_keeps_labels():
    dataset = torch.utils.data.TensorDataset(torch.arange(len(LABELS)))
    dataset.labels = LABELS
    subset = LabeledSubset(dataset, [3, 4, 10])
    assert subset.labels.tolist() == LABELS[[3, 4, 10]].tolist()
    assert [subset[i][0].item() for i in range(3)] == [3, 4, 10]
