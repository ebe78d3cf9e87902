"""Degenerate embedding rows (issue 12.4), for every consumer of ``prepare_embeddings``.

* Rows whose norm overflows the dtype (float32/bfloat16 norm above ~1.8e19) are normalized
  without overflow: the result equals the float64 computation, where nothing overflows.
* Zero rows follow PML's ``torch.nn.functional.normalize`` convention (``x / max(||x||, eps)``,
  so a zero row stays zero) with zero, finite gradient, in every dtype (float16 included).
"""

import pytest
import torch
import torch.nn.functional as F

from pml_rank_plugins.losses import FastAPLoss, QuantizedAPLoss, RankedListLoss
from pml_rank_plugins.miners import RankedListMiner

LOSSES = [FastAPLoss, QuantizedAPLoss, RankedListLoss]
CONSUMERS = LOSSES + [RankedListMiner]


def batch(n=10, dim=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=gen, dtype=torch.float64), torch.arange(n) % 3


def run(consumer_class, emb, labels):
    """Loss value (or the miner's pairs and weights) and, for losses, d loss / d emb."""
    emb = emb.detach().requires_grad_(True)
    out = consumer_class()(emb, labels)
    if consumer_class is RankedListMiner:
        return out, None
    (grad,) = torch.autograd.grad(out, emb)
    return out, grad


def assert_same_miner_output(got, want):
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    torch.testing.assert_close(got.weights.double(), want.weights.double(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("consumer_class", CONSUMERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1e20, 1e30])
def test_rows_whose_norm_overflows_are_normalized_exactly(consumer_class, dtype, scale):
    emb, labels = batch()
    emb[[0, 4]] *= scale
    emb = emb.to(dtype)
    assert not torch.isfinite(torch.linalg.vector_norm(emb[0].float()))  # the trap
    got, grad = run(consumer_class, emb, labels)
    # Reference: the same (rounded) input in float64, where the norm does not overflow.
    want, want_grad = run(consumer_class, emb.double(), labels)
    if consumer_class is RankedListMiner:
        return assert_same_miner_output(got, want)
    # the loss comes back in the embeddings' dtype: compare with the float64 value rounded to it
    torch.testing.assert_close(got.double(), want.to(got.dtype).double(), rtol=1e-5, atol=1e-6)
    assert torch.isfinite(grad).all()
    # bfloat16-rounded inputs give float32-vs-float64 gradient gaps of ~3e-4 even without any
    # huge row (rounding near the histogram kinks), hence the looser bound there.
    atol = 1e-3 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(grad.double(), want_grad, rtol=1e-3, atol=atol)


@pytest.mark.parametrize("consumer_class", CONSUMERS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_zero_rows_follow_pml_normalize_with_finite_zero_gradient(consumer_class, dtype):
    emb, labels = batch()
    emb[[1, 6]] = 0
    emb = emb.to(dtype)
    got, grad = run(consumer_class, emb, labels)
    # Independent value: PML's convention is F.normalize (eps 1e-12): zero rows stay zero.
    normalized = F.normalize(emb.double(), dim=1)
    assert torch.equal(normalized[1], torch.zeros(5, dtype=torch.float64))
    want, _ = run(consumer_class, normalized, labels)
    if consumer_class is RankedListMiner:
        return assert_same_miner_output(got, want)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
    # the loss comes back in the embeddings' dtype: compare with the float64 value rounded to it
    torch.testing.assert_close(got.double(), want.to(got.dtype).double(), **tol)
    assert grad.dtype == dtype and torch.isfinite(grad).all()
    assert torch.equal(grad[[1, 6]], torch.zeros(2, 5, dtype=dtype))
    assert grad.abs().sum() > 0  # the other rows still learn


@pytest.mark.parametrize("loss_class", LOSSES)
def test_zero_row_gradients_of_other_rows_match_float32(loss_class):
    emb, labels = batch()
    emb[2] = 0
    _, grad16 = run(loss_class, emb.half(), labels)
    _, grad32 = run(loss_class, emb.half().float(), labels)
    torch.testing.assert_close(grad16.float(), grad32, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("loss_class", LOSSES)
def test_ordinary_rows_unchanged_bit_for_bit(loss_class):
    # The overflow-safe normalization must not change anything for ordinary rows: same value and
    # gradient as PML's own F.normalize on pre-normalized input.
    emb, labels = batch(seed=3)
    emb = emb.float()
    got, grad = run(loss_class, emb, labels)
    e = emb.detach().requires_grad_(True)
    want = loss_class()(F.normalize(e, dim=1), labels)
    (want_grad,) = torch.autograd.grad(want, e)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, want_grad, rtol=1e-4, atol=1e-6)
