"""Embedding networks."""

from .conv_embedder import ConvEmbedder
from .resnet_embedder import ResNetEmbedder

__all__ = ["ConvEmbedder", "ResNetEmbedder"]
