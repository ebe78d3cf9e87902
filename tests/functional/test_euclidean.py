import pytest
import torch

from pml_rank_plugins.functional.euclidean import euclidean_distances
from tests.conftest import TEST_DEVICE


def test_matches_cdist_values_and_gradients():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(30, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randn(40, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(30, 40, generator=gen, dtype=torch.float64)
    d = euclidean_distances(x, y)
    torch.testing.assert_close(d, torch.cdist(x, y))
    ours = torch.autograd.grad(d, (x, y), grad)
    theirs = torch.autograd.grad(torch.cdist(x, y), (x, y), grad)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)


def test_gradcheck_float64():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randn(5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(euclidean_distances, (x, y))


def test_detached_side_and_zero_distance():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64, requires_grad=True)
    d = euclidean_distances(x, x.detach())
    assert d[0, 0] == 0 and d[1, 1] == 0
    (g,) = torch.autograd.grad(d[0, 0] + d[0, 1], x)
    # d(0,0) contributes nothing at zero distance; d(0,1) moves only the query row 0
    torch.testing.assert_close(
        g, torch.tensor([[2**-0.5, -(2**-0.5)], [0.0, 0.0]], dtype=torch.float64)
    )


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="need"):
        euclidean_distances(torch.zeros(3, 2), torch.zeros(3, 4))


def test_autocast_bfloat16_computes_in_the_input_dtype():
    # Under autocast the product used to run in bfloat16 and the backward then mixed bfloat16
    # and float32 ("mat1 and mat2 must have the same dtype").
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(7, 4, generator=gen, requires_grad=True)
    y = torch.randn(5, 4, generator=gen)
    with torch.autocast(TEST_DEVICE.type, dtype=torch.bfloat16):
        d = euclidean_distances(x, y)
    assert d.dtype == torch.float32
    (g,) = torch.autograd.grad(d.sum(), x)
    torch.testing.assert_close(d, torch.cdist(x, y))
    torch.testing.assert_close(g, torch.autograd.grad(torch.cdist(x, y).sum(), x)[0])
    with pytest.raises(ValueError, match="share one dtype"):
        euclidean_distances(x, y.double())
