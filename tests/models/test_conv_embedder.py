from __future__ import annotations

import pytest
import torch

from pml_rank_plugins.models import ConvEmbedder


@pytest.mark.parametrize("size", [28, 32])
def test_shapes_and_backward(size):
    torch.manual_seed(0)
    model = ConvEmbedder(in_channels=1, embedding_dim=16)
    out = model(torch.rand(4, 1, size, size))
    assert out.shape == (4, 16)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert model.trunk(torch.rand(2, 1, size, size)).shape == (2, model.trunk_output_size)


def test_normalize():
    torch.manual_seed(0)
    out = ConvEmbedder(embedding_dim=8, normalize=True)(torch.rand(3, 1, 32, 32))
    assert torch.allclose(out.norm(dim=1), torch.ones(3), atol=1e-5)
    raw = ConvEmbedder(embedding_dim=8)(torch.rand(3, 1, 32, 32))
    assert not torch.allclose(raw.norm(dim=1), torch.ones(3))


def test_rgb_and_bad_dim():
    assert ConvEmbedder(in_channels=3, embedding_dim=4)(torch.rand(2, 3, 32, 32)).shape == (2, 4)
    with pytest.raises(ValueError, match="embedding_dim"):
        ConvEmbedder(embedding_dim=0)


def test_on_test_device(device):
    model = ConvEmbedder(embedding_dim=8).to(device)
    out = model(torch.rand(2, 1, 32, 32, device=device))
    assert out.device.type == device.type and out.shape == (2, 8)
