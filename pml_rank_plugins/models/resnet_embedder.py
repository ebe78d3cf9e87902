"""ResNetEmbedder: a torchvision ResNet-18/50 trunk with an embedding head."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import nn

from .embedder import EmbeddingHead, TrunkEmbedder

_RESNETS = {18: "resnet18", 50: "resnet50"}  # depth -> torchvision.models factory


def _resnet(depth: int) -> nn.Module:
    """torchvision's ResNet-``depth`` with random weights. torchvision is imported here, not at
    module level: its import (seconds, through ``torchvision.ops`` and ``torch._dynamo``) is paid
    only by a process that builds a ResNet, not by every process that imports the models."""
    import torchvision

    return getattr(torchvision.models, _RESNETS[depth])(weights=None)


class _ResNetTrunk(nn.Module):
    """ResNet without its classifier: ``(B, C, H, W) -> (B, 512 or 2048)`` pooled features.
    With the standard 3-channel stem, grayscale (C = 1) input is repeated to 3 channels.

    ``weights_path``: built on the ``meta`` device and then given the file's tensors
    (:func:`load_resnet_weights` with ``assign=True``), so no random initialization is drawn only
    to be overwritten (about 0.5 s of CPU for a ResNet-50)."""

    def __init__(self, depth: int, in_channels: int = 3, weights_path: str | Path | None = None):
        super().__init__()
        with torch.device("meta") if weights_path is not None else contextlib.nullcontext():
            self.net = _resnet(depth)
            if in_channels != 3:
                self.net.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.in_channels = in_channels
        self.output_size = self.net.fc.in_features
        self.net.fc = nn.Identity()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.shape[1] == 1 and self.in_channels == 3:
            images = images.expand(-1, 3, -1, -1)
        return self.net(images)


class ResNetEmbedder(TrunkEmbedder):
    """torchvision ResNet-``depth`` trunk (18 or 50) + linear head to ``embedding_dim``.

    Weights are random (``weights=None``) unless ``weights_path`` names a state dict saved from a
    torchvision ResNet of the same depth (``torch.save(model.state_dict(), path)``; a
    ``"state_dict"`` wrapper and a ``"module."`` prefix are accepted, the ``fc.*`` classifier keys
    are ignored). Loading is strict otherwise, so a wrong file fails loudly. Nothing is ever
    downloaded. ``in_channels != 3`` replaces the stem convolution (then weights files must
    match that stem too). Output ``(B, embedding_dim)``, L2-normalized if ``normalize``.
    """

    def __init__(
        self,
        depth: int = 18,
        embedding_dim: int = 512,
        weights_path: str | Path | None = None,
        normalize: bool = False,
        in_channels: int = 3,
    ):
        super().__init__()
        if depth not in _RESNETS:
            raise ValueError(f"depth must be one of {sorted(_RESNETS)}, got {depth}")
        self.trunk = _ResNetTrunk(depth, in_channels, weights_path)
        if weights_path is not None:
            load_resnet_weights(self.trunk.net, weights_path, assign=True)
        self.embedder = EmbeddingHead(self.trunk.output_size, embedding_dim, normalize)
        self.trunk_output_size = self.trunk.output_size

    def load_trunk_weights(self, weights_path: str | Path) -> None:
        """Load a torchvision ResNet state dict into the trunk (see class docstring)."""
        load_resnet_weights(self.trunk.net, weights_path)


WEIGHTS_HINT = (
    "Nothing is downloaded at run time. Save torchvision's ImageNet weights once, on a machine "
    'with internet access: python -c "import torch, torchvision; torch.save(torchvision.models.'
    "resnet50(weights='IMAGENET1K_V1').state_dict(), 'resnet50_imagenet1k_v1.pth')\" "
    "(resnet18 / IMAGENET1K_V1 for depth 18), then put the file where weights_path points "
    "(relative paths start from --data-root)."
)


def load_resnet_weights(net: nn.Module, weights_path: str | Path, assign: bool = False) -> None:
    """Load a torchvision ResNet state dict (``"state_dict"`` wrapper, ``"module."`` prefix and
    ``fc.*`` keys tolerated) into ``net`` strictly; a missing file names it and says how to
    obtain it. ``assign``: the file's tensors become the parameters and buffers
    (``load_state_dict(assign=True)``, for a ``net`` built on the ``meta`` device), loaded onto
    torch's default device, where a module built without the file would be (so a model made
    after ``torch.set_default_device("cuda")`` is on the GPU whole, trunk and head); a tensor
    left on ``meta`` afterwards is an error naming it. Without ``assign`` the values are copied
    into ``net``'s tensors wherever they are."""
    path = Path(weights_path)
    if not path.is_file():
        raise FileNotFoundError(f"ResNet weights file not found: {path}. {WEIGHTS_HINT}")
    where = torch.get_default_device() if assign else torch.device("cpu")
    state = torch.load(path, map_location=where, weights_only=True)
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a state dict, got {type(state).__name__}")
    state = {(k[len("module.") :] if k.startswith("module.") else k): v for k, v in state.items()}
    state = {k: v for k, v in state.items() if not k.startswith("fc.")}
    try:
        net.load_state_dict(state, strict=True, assign=assign)
    except RuntimeError as err:
        raise ValueError(f"{path}: not a ResNet state dict of this depth: {err}") from err
    unset = [n for n, t in [*net.named_parameters(), *net.named_buffers()] if t.is_meta]
    if unset:
        raise ValueError(f"{path}: no values for {unset[:5]} (the state dict lacks them)")


class ResNetTrunk(nn.Module):
    """torchvision ResNet-``depth`` (18 or 50) without its classifier, as a PML ``trunk``:
    ``(B, C, H, W) -> (B, 512 | 2048)`` pooled features (``output_size``). Pair it with an
    :class:`~pml_rank_plugins.models.EmbeddingHead` ``embedder`` so the two get separate
    optimizers (e.g. the FastAP paper's 10x learning rate on the embedding layer).

    ``weights_path``: a torchvision ResNet state dict file (see :class:`ResNetEmbedder`); random
    weights if None. Never downloads.
    """

    def __init__(
        self, depth: int = 50, weights_path: str | Path | None = None, in_channels: int = 3
    ):
        super().__init__()
        if depth not in _RESNETS:
            raise ValueError(f"depth must be one of {sorted(_RESNETS)}, got {depth}")
        self.body = _ResNetTrunk(depth, in_channels, weights_path)
        if weights_path is not None:
            load_resnet_weights(self.body.net, weights_path, assign=True)
        self.output_size = self.body.output_size

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.body(images)
