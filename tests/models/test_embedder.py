from __future__ import annotations

import pytest
import torch

from pml_rank_plugins.models import EmbeddingHead


def test_linear_and_normalized():
    torch.manual_seed(0)
    head = EmbeddingHead(6, 3)
    x = torch.randn(4, 6)
    assert torch.allclose(head(x), x @ head.linear.weight.T + head.linear.bias)
    head.normalize = True
    expected = head.linear(x)
    expected = expected / expected.norm(dim=1, keepdim=True)
    assert torch.allclose(head(x), expected, atol=1e-6)


def test_bad_dim():
    with pytest.raises(ValueError, match="embedding_dim"):
        EmbeddingHead(6, 0)
