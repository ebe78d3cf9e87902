"""torchvision ResNet-18/50 trunk with a linear embedding head, as in the FastAP/RLL papers."""

from __future__ import annotations

import os

import torch
import torchvision
from torch import nn

_DEPTHS = {18: torchvision.models.resnet18, 50: torchvision.models.resnet50}


class ResNetEmbedder(nn.Module):
    """ResNet trunk (``weights=None``; optionally a torchvision-format state dict from
    ``weights_path``), ``fc`` replaced by a linear layer to ``embedding_dim``, optional L2
    normalization. No download ever happens."""

    def __init__(
        self,
        depth: int = 18,
        embedding_dim: int = 512,
        weights_path: str | os.PathLike | None = None,
        normalize: bool = False,
        in_channels: int = 3,
    ):
        super().__init__()
        if depth not in _DEPTHS:
            raise ValueError(f"depth must be one of {sorted(_DEPTHS)}, got {depth!r}")
        trunk = _DEPTHS[depth](weights=None)
        if weights_path is not None:
            state = torch.load(weights_path, map_location="cpu", weights_only=True)
            state = {k: v for k, v in state.items() if not k.startswith("fc.")}
            missing, unexpected = trunk.load_state_dict(state, strict=False)
            missing = [k for k in missing if not k.startswith("fc.")]
            if missing or unexpected:
                raise ValueError(
                    f"{weights_path} does not fit resnet{depth}: missing {missing[:5]}, "
                    f"unexpected {unexpected[:5]}"
                )
        if in_channels != 3:
            trunk.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        features = trunk.fc.in_features
        trunk.fc = nn.Identity()
        self.trunk = trunk
        self.head = nn.Linear(features, embedding_dim)
        self.normalize = normalize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.head(self.trunk(x))
        return nn.functional.normalize(out, dim=1) if self.normalize else out
