import re

import numpy as np
import pytest
import torch

from pml_rank_plugins.functional.validation import (
    check_finite,
    check_int,
    check_labels,
    compute_dtype,
    prepare_embeddings,
    validate_indices_tuple,
)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_check_finite_rejects_non_finite(bad):
    x = torch.zeros(3, 2)
    x[1, 0] = bad
    with pytest.raises(ValueError, match="embeddings contains 1 non-finite"):
        check_finite(x, "embeddings")


def test_check_finite_accepts_finite():
    big, tiny = torch.finfo(torch.float32).max, torch.finfo(torch.float32).tiny
    x = torch.tensor([[0.0, -1.0, 3.5], [big, -big, tiny]])
    before = x.clone()
    for finite in (x, x[:0], x.double(), x[:1].half()):
        assert check_finite(finite, "embeddings") is None
    assert torch.equal(x, before)  # checked, not modified
    x[1, 2] = float("nan")  # the same tensor with one NaN is refused
    with pytest.raises(ValueError, match="embeddings contains 1 non-finite"):
        check_finite(x, "embeddings")


@pytest.mark.parametrize(
    "given, expected",
    [
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_compute_dtype_promotes_half_precision(given, expected):
    assert compute_dtype(given) == expected


def test_prepare_embeddings_self_and_reference():
    x = torch.randn(4, 3, dtype=torch.float16)
    queries, refs, is_self = prepare_embeddings(x, x)
    assert is_self and refs is queries and queries.dtype == torch.float32
    r = torch.randn(5, 3, dtype=torch.float16)
    queries, refs, is_self = prepare_embeddings(x, r)
    assert not is_self and refs.shape == (5, 3) and refs.dtype == torch.float32
    r[2, 1] = float("nan")
    with pytest.raises(ValueError, match="ref_emb contains 1 non-finite"):
        prepare_embeddings(x, r)


# -- check_int (issue 12.14) ------------------------------------------------------------------
@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3), np.uint8(3)])
def test_check_int_accepts_python_and_numpy_integers(value):
    out = check_int(value, "num_bins", minimum=1)
    assert out == 3 and type(out) is int


@pytest.mark.parametrize("value", [True, False, 2.0, 1.7, "3", None, np.float64(3.0)])
def test_check_int_rejects_bool_float_and_others_naming_parameter(value):
    with pytest.raises(
        ValueError, match=r"num_bins must be an integer.*got " + re.escape(repr(value))
    ):
        check_int(value, "num_bins", minimum=1)


def test_check_int_enforces_bounds():
    with pytest.raises(ValueError, match=r"seed must be an integer >= 0, got -1"):
        check_int(-1, "seed", minimum=0)
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 1\], got 2"):
        check_int(2, "rank", minimum=0, maximum=1)
    assert check_int(-5, "offset") == -5


# -- validate_indices_tuple (issue 12.5) --------------------------------------------------------
def _pairs(a1, p, a2, n):
    return tuple(torch.tensor(v, dtype=torch.long) for v in (a1, p, a2, n))


def test_validate_indices_tuple_accepts_valid_pairs_triplets_and_none():
    pairs = _pairs([0, 3], [5, 1], [1], [0])  # anchors up to 3 < 4, others up to 5 < 6
    triplets = torch.tensor([0, 3]), torch.tensor([5, 1]), torch.tensor([2, 2])
    valid = [None, pairs, _pairs([], [], [], []), triplets, tuple(x.int() for x in triplets)]
    copies = [None if t is None else tuple(x.clone() for x in t) for t in valid]
    for indices_tuple, copied in zip(valid, copies, strict=True):
        assert validate_indices_tuple(indices_tuple, 4, 6) is None
        if indices_tuple is not None:  # checked, not modified
            assert all(torch.equal(x, y) for x, y in zip(indices_tuple, copied, strict=True))
    # the bounds are exclusive: one row fewer refuses the same tuples
    with pytest.raises(ValueError, match=r"indices_tuple\[1\] \(positives\) has index 5 >= 5"):
        validate_indices_tuple(pairs, 4, 5)
    with pytest.raises(ValueError, match=r"indices_tuple\[0\] \(anchors\) has index 3 >= 3"):
        validate_indices_tuple(triplets, 3, 6)


@pytest.mark.parametrize(
    "indices_tuple, message",
    [
        (_pairs([0], [1], [0], [40]), r"indices_tuple\[3\] \(negatives\) has index 40 >= 32 "),
        (_pairs([0], [1], [0], [-1]), r"indices_tuple\[3\] \(negatives\) has negative index -1"),
        (_pairs([0], [32], [0], [1]), r"indices_tuple\[1\] \(positives\) has index 32 >= 32 "),
        (_pairs([0], [1], [9], [1]), r"indices_tuple\[2\] \(negative anchors\) has index 9 >= 8 "),
        (_pairs([-3], [1], [0], [1]), r"indices_tuple\[0\] \(positive anchors\) has negative"),
        (
            (torch.tensor([0]), torch.tensor([1]), torch.tensor([40])),
            r"indices_tuple\[2\] \(negatives\) has index 40 >= 32 reference rows",
        ),
        (
            (torch.tensor([8]), torch.tensor([1]), torch.tensor([4])),
            r"indices_tuple\[0\] \(anchors\) has index 8 >= 8 query rows",
        ),
        (_pairs([0, 1], [1], [0], [2]), r"lengths.*indices_tuple\[0\].*2.*indices_tuple\[1\].*1"),
        (
            (torch.tensor([0, 1]), torch.tensor([1, 2]), torch.tensor([3])),
            r"lengths",
        ),
        (
            (torch.tensor([0.0]), torch.tensor([1]), torch.tensor([3])),
            r"indices_tuple\[0\].*integer",
        ),
        (
            (torch.tensor([True]), torch.tensor([1]), torch.tensor([3])),
            r"indices_tuple\[0\].*integer",
        ),
        ((torch.tensor([[0]]), torch.tensor([1]), torch.tensor([3])), r"indices_tuple\[0\].*1-D"),
        ((torch.tensor([0]), torch.tensor([1])), r"3 \(triplets\) or 4 \(pairs\).*got 2"),
        ([0, 1, 3], r"indices_tuple\[0\].*tensor"),
        (torch.tensor([0, 1, 2]), r"tuple"),
    ],
)
def test_validate_indices_tuple_names_the_bad_element(indices_tuple, message):
    with pytest.raises(ValueError, match=message):
        validate_indices_tuple(indices_tuple, 8, 32)


@pytest.mark.parametrize(
    "labels, fix",
    [
        (["cat", "dog"], "encode_labels"),
        (np.array(["cat", "dog"]), "encode_labels"),
        ([("vw", "golf"), ("vw", "polo")], "encode_labels"),
        ([1, 2], "torch.as_tensor(labels)"),
        (np.array([1.0, 2.0]), "torch.as_tensor(labels)"),
        ([torch.tensor(1), torch.tensor(2)], "torch.as_tensor(labels)"),  # as_tensor takes these
        ([], "torch.as_tensor(labels)"),
    ],
)
def test_check_labels_names_the_fix_that_works_for_the_labels_given(labels, fix):
    # issue 50: string labels were told "pass torch.as_tensor(labels)", which raises on them
    with pytest.raises(TypeError) as err:
        check_labels(labels)
    assert fix in str(err.value)
    other = "torch.as_tensor" if fix == "encode_labels" else "encode_labels"
    assert other not in str(err.value)
