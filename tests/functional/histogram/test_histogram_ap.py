import pytest
import torch

from pml_rank_plugins.functional.histogram.cpu import pair_categories, pair_histograms
from pml_rank_plugins.functional.histogram.reference import (
    exact_average_precision,
    histogram_ap,
    tie_aware_histogram_ap,
)


def loop_ap(h_pos, h_neg, num_pos, tie_aware=False):
    out = []
    for hp, hn, n in zip(h_pos.tolist(), h_neg.tolist(), num_pos.tolist()):
        ap, before_pos, before_all = 0.0, 0.0, 0.0
        for p, q in zip(hp, hn):
            if tie_aware:
                precision = (1 + p + 2 * before_pos) / (1 + p + q + 2 * before_all)
            else:
                total = before_all + p + q
                precision = (before_pos + p) / total if total > 0 else 0.0
            ap += precision * p / n
            before_pos += p
            before_all += p + q
        out.append(ap)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("tie_aware", [False, True])
def test_matches_loop_on_random_histograms(tie_aware):
    gen = torch.Generator().manual_seed(0)
    h_pos = torch.rand(6, 8, generator=gen, dtype=torch.float64)
    h_neg = torch.rand(6, 8, generator=gen, dtype=torch.float64)
    h_pos[0, :3] = 0  # leading empty bins: the 0/0 terms
    h_neg[0, :3] = 0
    num_pos = h_pos.sum(1)
    fn = tie_aware_histogram_ap if tie_aware else histogram_ap
    torch.testing.assert_close(fn(h_pos, h_neg, num_pos), loop_ap(h_pos, h_neg, num_pos, tie_aware))


def test_gradient_is_finite_with_empty_bins():
    h_pos = torch.tensor([[0.0, 0.0, 1.0, 1.0]], dtype=torch.float64, requires_grad=True)
    h_neg = torch.tensor([[0.0, 0.0, 0.0, 1.0]], dtype=torch.float64, requires_grad=True)
    histogram_ap(h_pos, h_neg, torch.tensor([2.0], dtype=torch.float64)).sum().backward()
    assert torch.isfinite(h_pos.grad).all() and torch.isfinite(h_neg.grad).all()


def test_exact_average_precision_by_hand():
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.1]])
    relevant = torch.tensor([[True, False, True, False]])
    assert exact_average_precision(scores, relevant).item() == pytest.approx((1 + 2 / 3) / 2)


def test_perfect_separation_gives_ap_one():
    h_pos = torch.tensor([[2.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    h_neg = torch.tensor([[0.0, 0.0, 3.0, 1.0]], dtype=torch.float64)
    assert histogram_ap(h_pos, h_neg, torch.tensor([3.0])).item() == pytest.approx(1.0)


def test_histogram_ap_converges_to_exact_ap_as_bins_grow():
    gen = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(20, 6, generator=gen, dtype=torch.float64), dim=1)
    r = torch.nn.functional.normalize(torch.randn(60, 6, generator=gen, dtype=torch.float64), dim=1)
    relevant = torch.rand(20, 60, generator=gen) < 0.3
    relevant[:, 0] = True
    exact = exact_average_precision(q @ r.T, relevant)
    categories = pair_categories(relevant, ~relevant)
    errors = []
    for bins in (4, 16, 64, 256):
        hist = pair_histograms(q, r, categories, bins / 2, -bins / 2, bins)
        approx = histogram_ap(hist[:, 0], hist[:, 1], relevant.sum(1).double())
        errors.append((approx - exact).abs().mean().item())
    # Soft assignment splits an item over two bins, so a small bias remains at any bin count.
    assert errors == sorted(errors, reverse=True)
    assert errors[-1] < 0.01 and errors[-1] < errors[0] / 4
