"""ConvEmbedder: a compact convnet for small grayscale images (GlyphDataset, Omniglot)."""

from __future__ import annotations

from torch import nn

from .embedder import EmbeddingHead, TrunkEmbedder


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


class ConvEmbedder(TrunkEmbedder):
    """Four conv3x3-BN-ReLU-maxpool blocks (32, 64, 128, 128 channels), global average pooling,
    then :class:`EmbeddingHead` to ``embedding_dim`` (optionally L2-normalized).

    Input ``(B, in_channels, H, W)`` with H, W >= 16 (28 x 28 and 32 x 32 are the intended sizes);
    output ``(B, embedding_dim)``. About 0.3 M parameters; runs on CPU and GPU alike.
    """

    def __init__(
        self,
        in_channels: int = 1,
        embedding_dim: int = 64,
        normalize: bool = False,
        widths: tuple[int, ...] = (32, 64, 128, 128),
    ):
        super().__init__()
        layers, cin = [], in_channels
        for width in widths:
            layers.append(_block(cin, width))
            cin = width
        self.trunk = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.embedder = EmbeddingHead(cin, embedding_dim, normalize)
        self.trunk_output_size = cin
