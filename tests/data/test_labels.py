import numpy as np
import pytest
import torch

from pml_rank_plugins.data.labels import CATEGORY, CLASS, as_two_level, encode_labels


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


# -- labels as users have them (issue 50, item 4) ---------------------------------------------------
def test_encode_labels_gives_sorted_ids_and_keeps_the_names():
    codes, names = encode_labels(["dog", "cat", "dog", "bird"])
    assert names == ["bird", "cat", "dog"]
    assert codes.dtype == torch.int64 and codes.tolist() == [2, 1, 2, 0]
    assert [names[c] for c in codes.tolist()] == ["dog", "cat", "dog", "bird"]
    # the same set of labels in another order: the same ids
    again, names_again = encode_labels(np.array(["bird", "dog", "cat"]))
    assert names_again == names and again.tolist() == [0, 2, 1]
    assert all(type(n) is str for n in names_again)  # numpy strings come back as str


@pytest.mark.parametrize(
    "labels, names, codes",
    [
        (
            [("vw", "golf"), ("audi", "a3"), ("vw", "golf")],
            [("audi", "a3"), ("vw", "golf")],
            [1, 0, 1],
        ),
        (torch.tensor([30, 10, 30]), [10, 30], [1, 0, 1]),
        ((2.5, 1.0), [1.0, 2.5], [1, 0]),
        ([], [], []),
    ],
)
def test_encode_labels_takes_tuples_numbers_and_tensors(labels, names, codes):
    got_codes, got_names = encode_labels(labels)
    assert got_names == names and got_codes.tolist() == codes


@pytest.mark.parametrize(
    "labels, error, message",
    [
        ("cat", TypeError, "got the string 'cat'"),
        (np.zeros((2, 2)), TypeError, r"1-D \(one per item\), got shape \(2, 2\)"),
        (["cat", None], ValueError, "label 1 is None"),
        ([1.0, float("nan")], ValueError, "label 1 is nan"),
        ([["a"], ["b"]], TypeError, r"label 0 \(\['a'\]\) is unhashable"),
        (["cat", 3], TypeError, r"mix types .*\(int, str\).*str\(label\)"),
    ],
)
def test_encode_labels_refuses_what_it_cannot_encode(labels, error, message):
    with pytest.raises(error, match=message):
        encode_labels(labels)


@pytest.mark.parametrize(
    "labels, categories, what",
    [
        (["cat", "dog"], None, "labels hold str values such as 'cat'"),
        (np.array([[1, 0], [2, 0]]).astype(str), None, "labels hold str values such as '1'"),
        ([0, 1], ["animals", "animals"], "categories hold str values such as 'animals'"),
    ],
)
def test_as_two_level_names_encode_labels_for_string_labels(labels, categories, what):
    # was: numpy's "ufunc 'remainder' not supported for the input types" (issue 50)
    with pytest.raises(TypeError, match=f"{what}.*pml_rank_plugins.data.encode_labels"):
        as_two_level(labels, categories)


def test_as_two_level_takes_encoded_string_labels_and_object_arrays_of_ints():
    classes, _ = encode_labels(["dog", "cat", "dog"])
    categories, _ = encode_labels(["animal", "animal", "animal"])
    assert as_two_level(classes, categories).tolist() == [[1, 0], [0, 0], [1, 0]]
    assert as_two_level(np.array([[1, 0], [2, 0]], dtype=object)).tolist() == [[1, 0], [2, 0]]


def test_wrapped_datasets_walks_outermost_first_and_stops_at_a_cycle():
    from torch.utils.data import Subset

    from pml_rank_plugins.data.labels import wrapped_datasets

    base = list(range(6))
    inner = Subset(base, [0, 1, 2])
    outer = Subset(inner, [0, 1])
    assert list(wrapped_datasets(outer)) == [outer, inner, base]
    loop = Subset(base, [0])
    loop.dataset = loop  # a wrapper that names itself: visited once, never an endless walk
    assert list(wrapped_datasets(loop)) == [loop]
