"""The sync-free glue of the histogram-AP losses (functional/histogram/sync_free.py,
ap_losses.py) against the CPU path's functions: values and gradients, edge rows, no syncs."""

from __future__ import annotations

import pytest
import torch

from pml_rank_plugins.functional.histogram import ap_losses, sync_free
from pml_rank_plugins.functional.histogram.cpu import pair_categories
from pml_rank_plugins.functional.histogram.reference import histogram_ap, tie_aware_histogram_ap
from pml_rank_plugins.functional.validation import normalize_rows
from pml_rank_plugins.utils.loss_and_miner_utils import pair_masks
from pml_rank_plugins.utils.op_count import OpCounter


def histograms(n=6, bins=5, seed=0):
    """Random non-negative histograms with empty leading bins in some rows (H = 0 there)."""
    gen = torch.Generator().manual_seed(seed)
    hist = torch.rand(n, 2, bins, generator=gen, dtype=torch.float64) * 3
    hist[0, :, :2] = 0  # empty first bins
    hist[1, 1] = 0  # positives only
    hist[2, 0] = 0  # no positive mass
    return hist.requires_grad_()


@pytest.mark.parametrize("tie_aware", [False, True])
def test_masked_ap_losses_equal_the_autograd_formula(tie_aware):
    hist = histograms()
    num_pos = torch.tensor([3, 2, 0, 1, 4, 2])
    ranked = torch.tensor([True, False, False, True, True, True])
    weights = torch.tensor([0.5, 1.0, 2.0, 1.5, 1.0, 0.25], dtype=torch.float64)
    formula = tie_aware_histogram_ap if tie_aware else histogram_ap

    def reference(h, w=None, mean_over=None):
        losses = torch.where(ranked, 1 - formula(h[:, 0], h[:, 1], num_pos.double()), 0)
        losses = losses if w is None else losses * w
        return losses if mean_over is None else losses.sum() / max(int(mean_over), 1)

    for w, mean_over in ((None, None), (weights, None), (weights, torch.tensor(5))):
        ours = ap_losses.masked_ap_losses(hist, num_pos, ranked, tie_aware, w, mean_over)
        expected = reference(hist, w, mean_over)
        torch.testing.assert_close(ours, expected, atol=1e-12, rtol=1e-12)
        grad = torch.randn(ours.shape, dtype=torch.float64)
        torch.testing.assert_close(
            torch.autograd.grad(ours, hist, grad)[0],
            torch.autograd.grad(expected, hist, grad)[0],
            atol=1e-12,
            rtol=1e-12,
        )
        # gradcheck away from empty bins (a finite difference there leaves the domain h >= 0).
        positive = (hist.detach() + 0.1).requires_grad_()
        assert torch.autograd.gradcheck(
            lambda h, w=w, m=mean_over: ap_losses.masked_ap_losses(
                h, num_pos, ranked, tie_aware, w, m
            ),
            (positive,),
        )
    assert ap_losses.masked_ap_losses(hist, num_pos, ranked, tie_aware)[~ranked].eq(0).all()
    with pytest.raises(ValueError, match=r"hist must be \(N, 2, B\)"):
        ap_losses.masked_ap_losses(hist[:, 0], num_pos, ranked)


def test_normalize_rows_sync_free_equals_normalize_rows():
    x = torch.randn(6, 4, dtype=torch.float64)
    x[1] *= 1e300  # overflows a plain sum of squares
    x[2] = 0  # zero row
    x[3] *= 1e-14  # ||x|| < eps: x / eps, constant
    x[4] *= 1e-3
    x.requires_grad_()
    expected = normalize_rows(x)
    ours = sync_free.normalize_rows_sync_free(x)
    torch.testing.assert_close(ours, expected, atol=0, rtol=1e-15)
    grad = torch.randn(6, 4, dtype=torch.float64)
    ours_grad = torch.autograd.grad(ours, x, grad)[0]
    torch.testing.assert_close(ours_grad, torch.autograd.grad(expected, x, grad)[0])
    assert ours_grad[2].eq(0).all() and ours_grad[3].eq(0).all()
    finite = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(sync_free.normalize_rows_sync_free, (finite,))


def test_label_counts_against_pair_masks():
    labels = torch.tensor([0, 1, 1, 2, 5, 0])
    ref_labels = torch.tensor([1, 0, 1, 1, 3, 0, 2], dtype=torch.int32)
    pos, neg = pair_masks(labels, ref_labels, exclude_self=False)
    num_pos, valid, ranked = sync_free.label_counts(labels, ref_labels, exclude_own=False)
    assert torch.equal(num_pos, pos.sum(1))
    assert torch.equal(valid, pos.sum(1) > 0)
    assert torch.equal(ranked, (pos.sum(1) > 0) & (neg.sum(1) > 0))
    square, _, ranked_own = sync_free.label_counts(labels, labels, exclude_own=True)
    pos, neg = pair_masks(labels, labels, exclude_self=True)
    assert torch.equal(square, pos.sum(1))
    assert torch.equal(ranked_own, (pos.sum(1) > 0) & (neg.sum(1) > 0))


def test_mined_categories_equal_pair_categories():
    labels = torch.tensor([0, 0, 1, 1, 2])
    pairs = (
        torch.tensor([0, 1, 2, 0, 2]),
        torch.tensor([1, 0, 3, 0, 3]),  # (0, 0): a self pair, (2, 3) twice
        torch.tensor([0, 3, 4, 4]),
        torch.tensor([2, 0, 1, 4]),  # (4, 4): a self pair
    )
    pos, neg = pair_masks(labels, labels, pairs, exclude_self=True)
    categories, num_pos, num_neg = sync_free.mined_categories(pairs, 5, 5, True)
    assert torch.equal(categories, pair_categories(pos, neg))
    assert torch.equal(num_pos, pos.sum(1)) and torch.equal(num_neg, neg.sum(1))


def test_balanced_query_weights_equal_the_cpu_rule():
    labels = torch.tensor([3, 1, 3, 3, 7, 1, 7, 9])
    valid = torch.tensor([True, True, True, False, True, True, False, False])
    ours = sync_free.balanced_query_weights(labels, valid)[valid]
    chosen = labels[valid]  # the CPU rule: over the valid queries, V / (K V_c)
    _, inverse, counts = torch.unique(chosen, return_inverse=True, return_counts=True)
    expected = len(chosen) / (len(counts) * counts[inverse].double())
    torch.testing.assert_close(ours, expected)
    assert (
        sync_free.balanced_query_weights(labels, torch.zeros(8, dtype=torch.bool)).isfinite().all()
    )


def test_the_glue_does_not_sync():
    x = torch.randn(8, 3, requires_grad=True)
    labels = torch.tensor([0, 1, 0, 1, 2, 2, 0, 1])
    with OpCounter(forbid_syncs=True):
        sync_free.normalize_rows_sync_free(x).sum().backward()
        sync_free.label_counts(labels, labels, True)
        sync_free.balanced_query_weights(labels, labels > 0)
        pairs = (torch.tensor([0]), torch.tensor([2]), torch.tensor([1]), torch.tensor([0]))
        sync_free.mined_categories(pairs, 8, 8, True)
        hist = histograms().detach().float().requires_grad_()
        ranked = torch.ones(6, dtype=torch.bool)
        ap_losses.masked_ap_losses(hist, torch.full((6,), 2), ranked).sum().backward()
