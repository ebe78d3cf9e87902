from __future__ import annotations

import numpy as np
import pytest
import torch

from pml_rank_plugins.data import (
    LabeledSubset,
    class_disjoint_kfold,
    class_disjoint_split,
    first_half_split,
    mlrc_protocol,
)


def make_labels(num_classes=20, seed=0):
    rng = np.random.default_rng(seed)
    classes = np.repeat(np.arange(num_classes) * 3 + 7, rng.integers(1, 6, num_classes))
    classes = classes[rng.permutation(len(classes))]
    return np.stack([classes, classes % 4], axis=1)


def classes_at(labels, idx):
    return set(labels[idx, 0].tolist())


@pytest.mark.parametrize("fractions", [(0.5, 0.5), (0.6, 0.2, 0.2), (0.25, 0.75)])
def test_split_is_class_disjoint_partition(fractions):
    labels = make_labels()
    parts = class_disjoint_split(labels, fractions, seed=1)
    assert len(parts) == len(fractions)
    every = np.concatenate(parts)
    assert sorted(every.tolist()) == list(range(len(labels)))  # each item exactly once
    sets = [classes_at(labels, p) for p in parts]
    for i in range(len(sets)):
        for j in range(i + 1, len(sets)):
            assert not sets[i] & sets[j]
    expected = np.diff(np.concatenate([[0], np.round(np.cumsum(fractions) * 20)])).astype(int)
    assert [len(s) for s in sets] == expected.tolist()
    for p in parts:
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0)


def test_split_deterministic_and_seeded():
    labels = make_labels()
    a = class_disjoint_split(labels, (0.5, 0.5), seed=3)
    b = class_disjoint_split(labels, (0.5, 0.5), seed=3)
    c = class_disjoint_split(labels, (0.5, 0.5), seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_split_unshuffled_and_1d_and_tensor():
    labels = make_labels()
    first, second = class_disjoint_split(labels, (0.5, 0.5), seed=None)
    assert classes_at(labels, first) == set(np.unique(labels[:, 0])[:10].tolist())
    for alt in (labels[:, 0], torch.from_numpy(labels)):
        again = class_disjoint_split(alt, (0.5, 0.5), seed=None)
        assert np.array_equal(again[0], first) and np.array_equal(again[1], second)


def test_split_bad_input():
    labels = make_labels()
    with pytest.raises(ValueError, match="sum to 1"):
        class_disjoint_split(labels, (0.5, 0.4))
    with pytest.raises(ValueError, match="positive"):
        class_disjoint_split(labels, (1.2, -0.2))
    with pytest.raises(ValueError, match="too few"):
        class_disjoint_split(labels[labels[:, 0] == 7], (0.5, 0.5))
    with pytest.raises(ValueError, match="shape"):
        class_disjoint_split(np.zeros((4, 3)), (0.5, 0.5))


def test_kfold_each_class_validated_once():
    labels = make_labels(num_classes=10)
    folds = class_disjoint_kfold(labels, num_folds=4, seed=0)
    assert len(folds) == 4
    validated = []
    for train, val in folds:
        assert not classes_at(labels, train) & classes_at(labels, val)
        assert sorted(np.concatenate([train, val]).tolist()) == list(range(len(labels)))
        validated.extend(classes_at(labels, val))
    assert sorted(validated) == sorted(np.unique(labels[:, 0]).tolist())
    assert sorted(len(classes_at(labels, v)) for _, v in folds) == [2, 2, 3, 3]


def test_kfold_bad_input():
    labels = make_labels(num_classes=3)
    with pytest.raises(ValueError, match="cannot make 4"):
        class_disjoint_kfold(labels, num_folds=4)
    with pytest.raises(ValueError, match="num_folds"):
        class_disjoint_kfold(labels, num_folds=1)


def test_first_half_and_mlrc_protocol():
    labels = make_labels(num_classes=21)
    sorted_classes = np.unique(labels[:, 0])
    trainval, test = first_half_split(labels)
    assert classes_at(labels, trainval) == set(sorted_classes[:10].tolist())
    assert classes_at(labels, test) == set(sorted_classes[10:].tolist())
    folds, test2 = mlrc_protocol(labels, num_folds=4)
    assert np.array_equal(test, test2)
    validated = []
    for train, val in folds:
        # indices refer to the full label array and stay inside the train+val half
        assert set(train.tolist()) | set(val.tolist()) == set(trainval.tolist())
        assert not classes_at(labels, train) & classes_at(labels, val)
        validated.extend(classes_at(labels, val))
    assert sorted(validated) == sorted_classes[:10].tolist()
    # unshuffled: the folds are consecutive class blocks
    assert classes_at(labels, folds[0][1]) == set(sorted_classes[:3].tolist())


def test_labeled_subset():
    class Tiny(torch.utils.data.Dataset):
        labels = make_labels()

        def __len__(self):
            return len(self.labels)

        def __getitem__(self, i):
            return torch.tensor([float(i)]), torch.from_numpy(self.labels[i])

    base = Tiny()
    idx = class_disjoint_split(base.labels, (0.5, 0.5))[1]
    subset = LabeledSubset(base, idx)
    assert isinstance(subset, torch.utils.data.Subset)
    assert len(subset) == len(idx)
    assert np.array_equal(subset.labels, base.labels[idx])
    assert subset[2][0].item() == idx[2]
