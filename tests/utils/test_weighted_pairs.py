import copy
import pickle
import re

import pytest
import torch
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from pml_rank_plugins import miners
from pml_rank_plugins.utils.loss_and_miner_utils import WeightedPairs


def test_public_miners_name_is_the_shared_class():
    assert miners.WeightedPairs is WeightedPairs


def test_is_a_pml_pair_tuple_carrying_weights():
    a1, p = torch.tensor([0, 1]), torch.tensor([1, 0])
    a2, n = torch.tensor([0, 0, 1]), torch.tensor([2, 3, 2])
    weights = torch.tensor([0.25, 0.75, 1.0])
    pairs = WeightedPairs(a1, p, a2, n, weights=weights)
    assert isinstance(pairs, tuple) and len(pairs) == 4
    assert all(u is v for u, v in zip(pairs, (a1, p, a2, n), strict=True))
    assert pairs.weights is weights
    labels = torch.tensor([0, 0, 1, 1])
    assert lmu.convert_to_pairs(pairs, labels) is pairs
    for clone in (copy.copy(pairs), copy.deepcopy(pairs), pickle.loads(pickle.dumps(pairs))):
        assert type(clone) is WeightedPairs
        assert torch.equal(clone.weights, weights)
        assert all(torch.equal(u, v) for u, v in zip(clone, pairs, strict=True))
    assert re.match(r"WeightedPairs\(\(tensor\(\[0, 1\](, device='\w+:?\d*')?\)", repr(pairs))


@pytest.mark.parametrize(
    "lengths", [(2, 2, 2, 2, 3), (2, 1, 2, 2, 2), (2, 2, 2, 1, 2), (2, 2, 1, 2, 2)]
)
def test_mismatched_lengths_are_refused(lengths):
    a1, p, a2, n, w = (torch.zeros(k, dtype=torch.long) for k in lengths)
    with pytest.raises(ValueError, match="mismatched lengths"):
        WeightedPairs(a1, p, a2, n, weights=w.float())
