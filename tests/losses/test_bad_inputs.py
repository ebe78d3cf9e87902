"""Clear errors at the call for bad inputs to the histogram-AP losses (issue 12, items 5, 14)."""

import numpy as np
import pytest
import torch

from pml_rank_plugins.data import encode_labels
from pml_rank_plugins.losses import FastAPLoss, QuantizedAPLoss, RankedListLoss
from pml_rank_plugins.miners import RankedListMiner

LOSSES = [FastAPLoss, QuantizedAPLoss]


@pytest.fixture
def batch():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(8, 4, generator=gen, requires_grad=True), torch.arange(8) % 2


@pytest.mark.parametrize("loss_class", LOSSES)
@pytest.mark.parametrize(
    "indices_tuple, message",
    [
        (
            (torch.tensor([0]), torch.tensor([1]), torch.tensor([0]), torch.tensor([-1])),
            r"indices_tuple\[3\] \(negatives\) has negative index -1",
        ),
        (
            (torch.tensor([0]), torch.tensor([2]), torch.tensor([0]), torch.tensor([40])),
            r"indices_tuple\[3\] \(negatives\) has index 40 >= 8 reference rows",
        ),
        (
            (torch.tensor([0]), torch.tensor([2]), torch.tensor([9])),
            r"indices_tuple\[2\] \(negatives\) has index 9 >= 8 reference rows",
        ),
    ],
)
def test_bad_indices_tuple_raises_naming_the_element(loss_class, batch, indices_tuple, message):
    emb, labels = batch
    # Index ranges are value checks: opt-in on the gpu backend (auto on CUDA), so asked for here.
    indices_tuple = tuple(t.to(emb.device) for t in indices_tuple)  # made at import, on the CPU
    with pytest.raises(ValueError, match=message):
        loss_class(check_values=True)(emb, labels, indices_tuple)


@pytest.mark.parametrize("loss_class", LOSSES)
def test_bool_labels_are_refused(loss_class, batch):
    emb, labels = batch
    with pytest.raises(ValueError, match=r"labels.*bool"):
        loss_class()(emb, labels.bool())


@pytest.mark.parametrize("loss_class", LOSSES)
@pytest.mark.parametrize("shape", [(8,), (8, 2, 2)])
def test_embeddings_must_be_2d(loss_class, shape):
    emb = torch.randn(*shape, requires_grad=True)
    with pytest.raises(ValueError, match=r"embeddings must be 2-D \(N, D\), got shape"):
        loss_class()(emb, torch.arange(8) % 2)


@pytest.mark.parametrize("loss_class", LOSSES)
def test_ref_emb_must_match_embedding_width(loss_class, batch):
    emb, labels = batch
    with pytest.raises(ValueError, match=r"ref_emb must be 2-D .* 4 columns.*got shape \(6, 3\)"):
        loss_class()(emb, labels, ref_emb=torch.randn(6, 3), ref_labels=torch.arange(6) % 2)


@pytest.mark.parametrize("loss_class", LOSSES)
@pytest.mark.parametrize("num_bins", [True, 2.0, 10.5, "10"])
def test_num_bins_must_be_an_integer(loss_class, num_bins):
    with pytest.raises(ValueError, match="num_bins must be an integer"):
        loss_class(num_bins=num_bins)


@pytest.mark.parametrize("loss_class", LOSSES)
def test_numpy_integer_sizes_are_accepted(loss_class, batch):
    emb, labels = batch
    loss = loss_class(num_bins=np.int64(12), chunk_size=np.int32(3))
    assert type(loss.num_bins) is int and type(loss.chunk_size) is int
    assert torch.isfinite(loss(emb, labels))


@pytest.mark.parametrize("loss_class", LOSSES)
@pytest.mark.parametrize("chunk_size", [0, True, 2.5])
def test_chunk_size_must_be_a_positive_integer(loss_class, chunk_size):
    with pytest.raises(ValueError, match="chunk_size must be an integer >= 1"):
        loss_class(chunk_size=chunk_size)


@pytest.mark.parametrize("cls", [FastAPLoss, QuantizedAPLoss])
def test_an_absurd_num_bins_is_refused_naming_it(cls):
    # issue 20 C3: `num_bins: 1e9` passed `check` (the constructor accepted it)
    with pytest.raises(ValueError, match="num_bins"):
        cls(num_bins=1_000_000_000)
    assert cls(num_bins=4096).num_bins == 4096


@pytest.mark.parametrize("make", [list, np.asarray], ids=["list", "numpy"])
@pytest.mark.parametrize("cls", [FastAPLoss, QuantizedAPLoss, RankedListLoss, RankedListMiner])
def test_labels_that_are_not_a_tensor_name_the_fix(cls, make):
    # Third audit item 12: a list or a numpy array failed inside PML with an AttributeError.
    labels = make([0, 0, 1, 1, 2, 2, 3, 3])
    with pytest.raises(TypeError, match=r"labels must be a torch.Tensor .* torch.as_tensor"):
        cls()(torch.randn(8, 4), labels)
    with pytest.raises(TypeError, match="ref_labels must be a torch.Tensor"):
        cls()(
            torch.randn(8, 4),
            torch.arange(8),
            ref_emb=torch.randn(4, 4),
            ref_labels=make([0, 1, 2, 3]),
        )


@pytest.mark.parametrize("make", [list, np.asarray], ids=["list", "numpy"])
@pytest.mark.parametrize("cls", [FastAPLoss, QuantizedAPLoss, RankedListLoss, RankedListMiner])
def test_string_labels_name_encode_labels(cls, make):
    # issue 50: the advice was "pass torch.as_tensor(labels)", which raises on strings
    labels = make(["cat", "cat", "dog", "dog"])
    with pytest.raises(TypeError, match=r"list of str labels|ndarray of str_ labels") as err:
        cls()(torch.randn(4, 4), labels)
    assert "pml_rank_plugins.data.encode_labels(labels)" in str(err.value)
    assert "as_tensor" not in str(err.value)
    codes, _ = encode_labels(labels)  # the route the message names works
    assert codes.tolist() == [0, 0, 1, 1]
    out = cls()(torch.randn(4, 4), codes)
    assert (out[0] if cls is RankedListMiner else out).isfinite().all()
