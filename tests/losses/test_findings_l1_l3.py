"""Issue 20, findings L1-L3: bool labels, indices_tuple on an empty ref_emb, float16 gradients."""

import pytest
import torch

from pml_rank_plugins.losses import FastAPLoss, QuantizedAPLoss, RankedListLoss
from pml_rank_plugins.miners import RankedListMiner

from ..conftest import make_embeddings_and_labels

FLOAT16_MAX = torch.finfo(torch.float16).max


def batch(n=32, dim=8, dtype=torch.float64, seed=0):
    return make_embeddings_and_labels(n=n, dim=dim, num_classes=4, dtype=dtype, seed=seed)


@pytest.mark.parametrize("make", [RankedListLoss, RankedListMiner])
def test_L1_ranked_list_refuses_bool_labels_like_the_histogram_losses(make):
    x, labels = batch()
    with pytest.raises(ValueError, match=r"labels has dtype torch.bool; labels are class ids"):
        make()(x, labels % 2 == 0)
    ref = (x[:8].detach(), labels[:8] % 2 == 0)
    args = (None, *ref) if make is RankedListLoss else ref  # the loss takes indices_tuple first
    with pytest.raises(ValueError, match=r"ref_labels has dtype torch.bool"):
        make()(x, labels, *args)
    with pytest.raises(ValueError, match=r"labels has dtype torch.bool"):
        FastAPLoss()(x, labels % 2 == 0)  # the histogram losses' message, for comparison


@pytest.mark.parametrize("loss_cls", [FastAPLoss, QuantizedAPLoss, RankedListLoss])
@pytest.mark.parametrize(
    "indices_tuple, message",
    [
        (
            (torch.tensor([0]), torch.tensor([3]), torch.tensor([0]), torch.tensor([1])),
            r"indices_tuple\[1\] \(positives\) has index 3 >= 0 reference rows",
        ),
        (
            (torch.tensor([0.0]), torch.tensor([1]), torch.tensor([0]), torch.tensor([1])),
            r"indices_tuple\[0\] \(positive anchors\) must hold integer indices",
        ),
        ((torch.tensor([0]), torch.tensor([1])), r"must have 3 \(triplets\) or 4 \(pairs\)"),
    ],
)
def test_L2_empty_ref_emb_still_validates_indices_tuple(loss_cls, indices_tuple, message):
    x, labels = batch()
    empty = torch.zeros(0, x.shape[1], dtype=x.dtype)
    indices_tuple = tuple(t.to(x.device) for t in indices_tuple)  # made at import, on the CPU
    # check_values: index ranges are value checks, opt-in on the gpu backend (auto on CUDA)
    with pytest.raises(ValueError, match=message):
        loss_cls(check_values=True)(x, labels, indices_tuple, empty, labels[:0])
    # A valid (empty) tuple still gives the documented connected zero.
    nothing = tuple(torch.zeros(0, dtype=torch.long) for _ in range(4))
    loss = loss_cls()(x, labels, nothing, empty, labels[:0])
    assert loss.item() == 0.0


def _float16_grad(loss_fn, scale=1.0):
    x, labels = batch(dtype=torch.float16)
    loss = loss_fn(x, labels)
    (grad,) = torch.autograd.grad(loss * scale, x)
    return loss, grad


def test_L3_ranked_list_float16_gradient_in_range_is_finite_and_exact():
    # Documented range: entries are about (1 + lam) / (N ||x||) at most; N = 32, ||x|| ~ 1:
    # finite up to lam ~ 1.5e6. At lam = 1e3 the float16 gradient is the float32 one, rounded.
    loss_fn = RankedListLoss(lam=1e3)
    loss, grad = _float16_grad(loss_fn)
    assert grad.dtype == torch.float16 and torch.isfinite(grad).all() and torch.isfinite(loss)
    x, labels = batch(dtype=torch.float16)
    x32 = x.detach().float().requires_grad_()
    (grad32,) = torch.autograd.grad(loss_fn(x32, labels), x32)
    torch.testing.assert_close(grad.float(), grad32.to(torch.float16).float(), rtol=0, atol=0)


def test_L3_ranked_list_float16_gradient_out_of_range_is_inf_loss_in_float16():
    # Documented: lam = 1e10 (the audit's case) makes entries exceed float16's 65504: they are
    # inf (GradScaler's overflow signal), never NaN; the loss (computed in float32) is returned in float16.
    loss, grad = _float16_grad(RankedListLoss(lam=1e10))
    # the loss comes back in the embeddings' dtype; its float32 value is beyond float16's range
    assert loss.dtype == torch.float16 and torch.isinf(loss)
    assert torch.isinf(grad).any() and not torch.isnan(grad).any()
    assert grad.float().abs().max() == float("inf")
    finite = grad[torch.isfinite(grad)].float().abs()
    assert (finite <= FLOAT16_MAX).all()


@pytest.mark.parametrize("loss_cls", [FastAPLoss, QuantizedAPLoss])
def test_L3_histogram_float16_gradient_range(loss_cls):
    # Documented: at N = 32, ||x|| ~ 1 the largest entry is about 0.04 for the default num_bins
    # (growing roughly like num_bins and 1 / (N ||x||)), so finite; a loss scale (a GradScaler's)
    # past float16's range makes the gradient non-finite, which is what GradScaler checks before
    # it skips the step and lowers the scale (the loss itself is float16 now, as in PML, so the
    # overflow can show as NaN as well as inf).
    loss, grad = _float16_grad(loss_cls())
    assert torch.isfinite(grad).all() and grad.float().abs().max() < 1.0
    _, scaled = _float16_grad(loss_cls(), scale=2.0**24)
    assert not torch.isfinite(scaled).all()
