"""Embedding models: a compact convnet for small grayscale images and ResNet-18/50 trunks."""

from .convnet import ConvEmbedder
from .embedder import EmbeddingHead
from .resnet import ResNetEmbedder

__all__ = ["ConvEmbedder", "ResNetEmbedder", "EmbeddingHead"]
