"""A compact convnet embedder for small grayscale images (CPU-friendly)."""

from __future__ import annotations

import torch
from torch import nn


class ConvEmbedder(nn.Module):
    """Four conv3x3-BN-ReLU-maxpool blocks (32, 64, 128, 128 channels), global average pooling and
    a linear layer to ``embedding_dim``; optionally L2-normalized. About 12 MFLOPs per 32x32
    image, 0.3M parameters. Input ``(B, in_channels, H, W)`` with H, W >= 16."""

    def __init__(self, in_channels: int = 1, embedding_dim: int = 64, normalize: bool = False):
        super().__init__()
        if in_channels < 1 or embedding_dim < 1:
            raise ValueError("in_channels and embedding_dim must be >= 1")
        blocks, channels = [], in_channels
        for width in (32, 64, 128, 128):
            blocks += [
                nn.Conv2d(channels, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
            ]
            channels = width
        self.features = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(channels, embedding_dim)
        self.normalize = normalize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.head(self.features(x))
        return nn.functional.normalize(out, dim=1) if self.normalize else out
