"""``pml_rank_plugins.losses.SelfSupervisedLoss``: PML's wrapper, accepting our list-wise losses.

The expected values come from the loop references (written from the papers' equations) applied
to PML's definition of the wrapper: item labels ``arange(N)``; ``symmetric=True`` ranks the
``2N`` rows of ``cat([embeddings, ref_emb])`` against each other, ``symmetric=False`` ranks
``embeddings`` against ``ref_emb``.
"""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning.losses import ContrastiveLoss
from pytorch_metric_learning.losses import SelfSupervisedLoss as PMLSelfSupervisedLoss

from pml_rank_plugins.losses import FastAPLoss, QuantizedAPLoss, RankedListLoss, SelfSupervisedLoss

from ..reference_histogram_ap import fastap_reference, quantized_ap_reference
from ..reference_ranked_list import reference_rll

N, DIM = 6, 4


def two_views(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, DIM)`` float64 embeddings and a noisy second view of each row."""
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randn(N, DIM, generator=gen, dtype=torch.float64)
    ref = emb + 0.5 * torch.randn(N, DIM, generator=gen, dtype=torch.float64)
    return emb.requires_grad_(True), ref.requires_grad_(True)


def _fastap(x, labels, r=None, ref_labels=None):
    return fastap_reference(x, labels, 10, ref_emb=r, ref_labels=ref_labels)[0]


def _quantized_ap(x, labels, r=None, ref_labels=None):
    return quantized_ap_reference(x, labels, 20, ref_emb=r, ref_labels=ref_labels)[0]


def _rll(x, labels, r=None, ref_labels=None):
    return torch.stack(reference_rll(x, labels, r, ref_labels)).mean()


CASES = [(FastAPLoss, _fastap), (QuantizedAPLoss, _quantized_ap), (RankedListLoss, _rll)]


@pytest.mark.parametrize("loss_cls, reference", CASES, ids=lambda c: getattr(c, "__name__", ""))
@pytest.mark.parametrize("symmetric", [True, False])
def test_value_and_gradient_are_the_loss_of_the_view_pairs(loss_cls, reference, symmetric):
    emb, ref = two_views()
    loss = SelfSupervisedLoss(loss_cls(), symmetric=symmetric)(emb, ref)
    grads = torch.autograd.grad(loss, (emb, ref), allow_unused=True)

    e2, r2 = emb.detach().clone().requires_grad_(True), ref.detach().clone().requires_grad_(True)
    items = list(range(N))
    if symmetric:
        want = reference(torch.cat([e2, r2]), items + items)
    else:
        want = reference(e2, items, r2, items)
    want_grads = torch.autograd.grad(want, (e2, r2), allow_unused=True)
    assert 0 < float(loss.detach()) < 1.5  # random views: neither perfect nor degenerate
    torch.testing.assert_close(loss, want.detach())
    for got, exp in zip(grads, want_grads, strict=True):
        if exp is None:  # RLL without gallery_gradient: no gradient through ref_emb's lists
            assert got is None or torch.count_nonzero(got) == 0
        else:
            torch.testing.assert_close(got, exp)


@pytest.mark.parametrize("loss_cls", [FastAPLoss, QuantizedAPLoss, RankedListLoss])
@pytest.mark.parametrize("symmetric", [True, False])
def test_each_view_nearest_its_twin_gives_zero_loss(loss_cls, symmetric):
    # Orthogonal items, each view equal to its twin: the one positive of every query comes first,
    # at distance 0, every negative at distance sqrt(2): AP = 1 and no RLL pair violates a margin.
    emb = torch.eye(N, dtype=torch.float64)
    loss = SelfSupervisedLoss(loss_cls(), symmetric=symmetric)(emb, emb.clone())
    torch.testing.assert_close(loss, torch.zeros((), dtype=torch.float64))


def test_pmls_wrapper_refuses_our_losses_and_ours_accepts_them():
    with pytest.raises(Exception, match="SelfSupervisedLoss not supported for FastAPLoss"):
        PMLSelfSupervisedLoss(FastAPLoss())
    for loss_cls in (FastAPLoss, QuantizedAPLoss, RankedListLoss):
        assert isinstance(SelfSupervisedLoss(loss_cls()), PMLSelfSupervisedLoss)
    # PML's own list is kept, and PML's class is left unchanged.
    assert set(PMLSelfSupervisedLoss.supported_losses()) < set(
        SelfSupervisedLoss.supported_losses()
    )
    assert "FastAPLoss" not in PMLSelfSupervisedLoss.supported_losses()
    SelfSupervisedLoss(ContrastiveLoss())

    class NotOnTheList(torch.nn.Module):
        pass

    with pytest.raises(Exception, match="SelfSupervisedLoss not supported for NotOnTheList"):
        SelfSupervisedLoss(NotOnTheList())
