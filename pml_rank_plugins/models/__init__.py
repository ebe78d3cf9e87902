"""Embedding models: a compact convnet for small grayscale images and ResNet-18/50 trunks."""

from .conv_embedder import ConvEmbedder
from .embedder import EmbeddingHead
from .resnet_embedder import ResNetEmbedder, ResNetTrunk

__all__ = ["ConvEmbedder", "ResNetEmbedder", "ResNetTrunk", "EmbeddingHead"]
