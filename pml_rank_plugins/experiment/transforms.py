"""Per-split image transforms (``transforms: {train: [...], eval: [...]}``) and their checks.

Config shape (powerful-benchmarker's)::

    transforms:
      train:                 # applied to the 'train' split
        - RandomResizedCrop: {size: 227, scale: [0.16, 1.0]}
        - RandomHorizontalFlip: {}
        - ToTensor: {}
        - Normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
      eval:                  # every other split, and the test sets
        - Resize: {size: 256}
        - CenterCrop: {size: 227}
        - ToTensor: {}
        - Normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}

Each list becomes a :class:`NamedCompose` (applies its steps in order like
``torchvision.transforms.Compose`` and remembers its config key). A list item is any
``{ClassName: kwargs}`` the registry resolves. Without ``transforms`` a dataset keeps its built-in
conversion (grayscale GlyphDataset / Omniglot).

Images of unequal sizes cannot be stacked into a batch; :class:`ShapeCheckedCollate` turns
PyTorch's ``stack expects each tensor to be equal size`` into an error naming the key
(``transforms.train`` ...) and the fix.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils.data import default_collate

from .instantiate import build_object
from .schema import ConfigError

SPLIT_KINDS = ("train", "eval")


class NamedCompose:
    """Apply ``transforms`` in order (``torchvision.transforms.Compose``'s contract: the
    ``transforms`` list, call, ``repr``) and carry ``key`` (its config path) for error messages.

    Not a subclass of torchvision's ``Compose``: that would import torchvision (seconds, through
    ``torchvision.ops`` and ``torch._dynamo``) in every process that imports the runner, also for
    the runs that use no transform. Picklable (dataloader workers); a call is O(len(transforms)).
    """

    def __init__(self, transforms: list[Callable], key: str):
        self.transforms = transforms
        self.key = key

    def __call__(self, img: Any) -> Any:
        for transform in self.transforms:
            img = transform(img)
        return img

    def __repr__(self) -> str:
        steps = "".join(f"\n    {t}" for t in self.transforms)
        return f"{type(self).__name__}({steps}\n)"


def build_transforms(config: dict) -> dict[str, NamedCompose] | None:
    """``{"train": Compose, "eval": Compose}`` from ``config["transforms"]``, or None if absent.

    A missing ``eval`` entry is an error (train-time augmentation must not run at test time);
    a missing ``train`` entry reuses ``eval``.
    """

    spec = config.get("transforms")
    if spec is None:
        return None
    if not isinstance(spec, dict) or set(spec) - set(SPLIT_KINDS):
        raise ConfigError(
            f"transforms: expected {{train: [...], eval: [...]}}, got keys "
            f"{sorted(spec) if isinstance(spec, dict) else spec!r}"
        )
    if "eval" not in spec:
        raise ConfigError("transforms: needs an 'eval' list (used for every split but 'train')")
    out = {}
    for kind in SPLIT_KINDS:
        items = spec.get(kind, spec["eval"])
        key = f"transforms.{kind}" if kind in spec else "transforms.eval"
        if not isinstance(items, list):
            raise ConfigError(f"{key}: expected a list of {{ClassName: kwargs}}, got {items!r}")
        out[kind] = NamedCompose(
            [build_object(item, f"{key}[{i}]") for i, item in enumerate(items)], key
        )
    return out


def dataset_transform_key(dataset) -> str:
    """The config key of the transform feeding ``dataset`` (follows Subset wrappers)."""
    seen = 0
    while hasattr(dataset, "dataset") and seen < 10:
        dataset, seen = dataset.dataset, seen + 1
    transform = getattr(dataset, "transform", None)
    key = getattr(transform, "key", None)
    if key:
        return key
    return "transforms (not set: the dataset's built-in conversion keeps every image's own size)"


class ShapeCheckedCollate:
    """PyTorch's ``default_collate`` that names the transform key when image sizes differ.

    Picklable (dataloader workers) and stateless; O(batch).
    """

    def __init__(self, where: str):
        self.where = where

    def __call__(self, batch: list[Any]):
        try:
            return default_collate(batch)
        except RuntimeError as err:
            if "stack expects each tensor to be equal size" not in str(err):
                raise
            shapes = sorted({tuple(item[0].shape) for item in batch if torch.is_tensor(item[0])})
            raise ConfigError(
                f"{self.where}: images of unequal sizes {shapes[:4]} cannot form a batch. "
                "End the transform list with a fixed-size step (RandomResizedCrop {size: S} for "
                "transforms.train, Resize + CenterCrop {size: S} for transforms.eval), or "
                "evaluate with batch_size 1."
            ) from err


def collate_for(dataset, role: str) -> ShapeCheckedCollate:
    """A :class:`ShapeCheckedCollate` naming the transform key behind ``dataset``."""
    return ShapeCheckedCollate(f"{role}: {dataset_transform_key(dataset)}")
