import numpy as np
import pytest
import torch

from pml_rank_plugins.functional.chunking import LabelCategories
from pml_rank_plugins.functional.histogram.cpu import pair_categories
from pml_rank_plugins.utils.loss_and_miner_utils import (
    check_chunk_size,
    pair_masks,
    ranked_list_categories,
)


@pytest.mark.parametrize("value, expected", [(None, None), (1, 1), (np.int64(7), 7)])
def test_check_chunk_size_accepts_none_and_positive_integers(value, expected):
    out = check_chunk_size(value)
    assert out == expected and (out is None or type(out) is int)


@pytest.mark.parametrize("value", [0, -3, 2.0, True, "8"])
def test_check_chunk_size_rejects_others_naming_it(value):
    with pytest.raises(ValueError, match="chunk_size must be an integer"):
        check_chunk_size(value)


@pytest.mark.parametrize("is_self", [True, False])
def test_label_categories_equal_the_dense_categories_of_the_masks(is_self):
    labels = torch.tensor([0, 1, 0, 2, 1])
    ref_labels = labels if is_self else torch.tensor([1, 0, 0, 2, 2, 1])
    categories = ranked_list_categories(labels, ref_labels, None, is_self)
    assert isinstance(categories, LabelCategories)
    dense = pair_categories(*pair_masks(labels, ref_labels, exclude_self=is_self))
    assert categories.shape == tuple(dense.shape)
    assert torch.equal(categories.rows(0, len(labels)).to(dense.dtype), dense)


def test_mined_pairs_give_dense_categories_of_those_pairs():
    labels = torch.tensor([0, 0, 1, 1])
    mined = (torch.tensor([0]), torch.tensor([1]), torch.tensor([3]), torch.tensor([0]))
    categories = ranked_list_categories(labels, labels, mined, True)
    assert categories.dtype == torch.int8
    expected = torch.full((4, 4), 2, dtype=torch.int8)
    expected[0, 1], expected[3, 0] = 0, 1
    assert torch.equal(categories, expected)
