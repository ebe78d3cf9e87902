import numpy as np
import pytest
import torch

from pml_rank_plugins.data.labels import CATEGORY, CLASS, as_two_level


def test_two_arrays_are_stacked_class_then_category():
    out = as_two_level(np.array([3, 3, 5]), np.array([0, 0, 1]))
    assert out.shape == (3, 2)
    assert out[:, CLASS].tolist() == [3, 3, 5]
    assert out[:, CATEGORY].tolist() == [0, 0, 1]


def test_tensor_input_accepted():
    out = as_two_level(torch.tensor([[1, 0], [1, 0], [2, -1]]))
    assert out.dtype == np.int64 and out.tolist() == [[1, 0], [1, 0], [2, -1]]


@pytest.mark.parametrize(
    "labels, categories, message",
    [
        (np.zeros((3, 3)), None, r"shape \(N, 2\)"),
        (np.zeros(3), np.zeros(4), "differ in length"),
        (np.zeros((3, 2)), np.zeros(3), "both must be 1-D"),
        (np.array([[1, 0], [1, 1]]), None, "more than one category"),
        (np.array([[0.5, 0.0]]), None, "integers"),
    ],
)
def test_bad_labels_raise(labels, categories, message):
    with pytest.raises(ValueError, match=message):
        as_two_level(labels, categories)
