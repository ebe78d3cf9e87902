import pytest
import torch

from pml_rank_plugins.losses.pair_masks import pair_masks as old_pair_masks
from pml_rank_plugins.utils.loss_and_miner_utils import pair_masks


def test_default_masks_exclude_self_and_split_by_label():
    labels = torch.tensor([0, 0, 1])
    pos, neg = pair_masks(labels, labels)
    assert pos.tolist() == [[False, True, False], [True, False, False], [False, False, False]]
    assert neg.tolist() == [[False, False, True], [False, False, True], [True, True, False]]


def test_ref_set_keeps_all_pairs():
    pos, neg = pair_masks(torch.tensor([0, 1]), torch.tensor([1, 1, 0]), exclude_self=False)
    assert pos.tolist() == [[False, False, True], [True, True, False]]
    assert (neg == ~pos).all()


def test_indices_tuple_restricts_lists_to_mined_pairs():
    labels = torch.tensor([0, 0, 1, 1])
    a1, p = torch.tensor([0, 0]), torch.tensor([1, 1])  # duplicate pair counts once
    a2, n = torch.tensor([0, 3]), torch.tensor([2, 1])
    pos, neg = pair_masks(labels, labels, (a1, p, a2, n))
    assert pos.nonzero().tolist() == [[0, 1]]
    assert neg.nonzero().tolist() == [[0, 2], [3, 1]]


def test_triplets_are_converted_to_pairs():
    labels = torch.tensor([0, 0, 1])
    pos, neg = pair_masks(labels, labels, (torch.tensor([0]), torch.tensor([1]), torch.tensor([2])))
    assert pos.nonzero().tolist() == [[0, 1]]
    assert neg.nonzero().tolist() == [[0, 2]]


@pytest.mark.parametrize(
    "indices_tuple, message",
    [
        # A negative index used to wrap around silently to the last row.
        (
            (torch.tensor([0]), torch.tensor([1]), torch.tensor([0]), torch.tensor([-1])),
            r"indices_tuple\[3\] \(negatives\) has negative index -1",
        ),
        # Out of range used to fail as a bare IndexError.
        (
            (torch.tensor([0]), torch.tensor([1]), torch.tensor([4])),
            r"indices_tuple\[2\] \(negatives\) has index 4 >= 4 reference rows",
        ),
    ],
)
def test_bad_indices_tuple_raises_naming_the_element(indices_tuple, message):
    labels = torch.tensor([0, 0, 1, 1])
    with pytest.raises(ValueError, match=message):
        pair_masks(labels, labels, indices_tuple)


def test_old_import_path_gives_the_same_function():
    assert old_pair_masks is pair_masks
