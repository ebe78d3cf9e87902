"""Embedding heads shared by every model: linear projection with optional L2 normalization."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class EmbeddingHead(nn.Module):
    """``x -> W x + b`` to ``embedding_dim``, then ``x / ||x||_2`` if ``normalize``. O(B D E)."""

    def __init__(self, in_features: int, embedding_dim: int, normalize: bool = False):
        super().__init__()
        if embedding_dim < 1:
            raise ValueError(f"embedding_dim must be >= 1, got {embedding_dim}")
        self.linear = nn.Linear(in_features, embedding_dim)
        self.normalize = bool(normalize)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out = self.linear(features)
        return F.normalize(out, p=2, dim=1) if self.normalize else out


class TrunkEmbedder(nn.Module):
    """``embedder(trunk(x))``; ``trunk`` and ``embedder`` are exposed so a PML trainer can take
    ``models={"trunk": m.trunk, "embedder": m.embedder}``."""

    trunk: nn.Module
    embedder: EmbeddingHead

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.embedder(self.trunk(images))
