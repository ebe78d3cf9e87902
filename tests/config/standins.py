"""Tiny stand-ins for the contract's dataset/model/split, registered for config tests.

They follow the contract (``.labels`` (N, 2), items ``(image (C, H, W), label[2])``) so the runner
is exercised exactly as with ``GlyphDataset``/``ConvEmbedder``, in well under a second per epoch.
"""

from __future__ import annotations

import numpy as np
import torch

from pml_rank_plugins.config import registry


class TinyDataset(torch.utils.data.Dataset):
    """``num_classes`` classes x ``per_class`` noisy copies of a random 1x8x8 prototype.

    Class c belongs to category ``c % num_categories``.
    """

    def __init__(self, num_classes=12, per_class=6, num_categories=3, noise=1.5, seed=0):
        gen = torch.Generator().manual_seed(seed)
        protos = torch.randn(num_classes, 1, 8, 8, generator=gen)
        classes = np.repeat(np.arange(num_classes), per_class)
        self.labels = np.stack([classes, classes % num_categories], axis=1).astype(np.int64)
        self.images = protos[classes] + noise * torch.randn(len(classes), 1, 8, 8, generator=gen)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], torch.as_tensor(self.labels[i])


class TinyNet(torch.nn.Module):
    """Flatten -> Linear -> BatchNorm1d (so BN running stats are part of resume state)."""

    def __init__(self, in_features=64, embedding_dim=16):
        super().__init__()
        self.fc = torch.nn.Linear(in_features, embedding_dim)
        self.bn = torch.nn.BatchNorm1d(embedding_dim)

    def forward(self, x):
        return self.bn(self.fc(x.flatten(1)))


def tiny_class_disjoint_split(labels, fractions=(0.5, 0.5), seed=0):
    """Classes shuffled and cut by ``fractions``; returns one index array per fraction."""
    labels = np.asarray(labels)
    classes = np.unique(labels[:, 0])
    rng = np.random.default_rng(seed)
    rng.shuffle(classes)
    cuts = np.round(np.cumsum(fractions) / np.sum(fractions) * len(classes)).astype(int)
    parts = np.split(classes, cuts[:-1])
    return tuple(np.flatnonzero(np.isin(labels[:, 0], p)) for p in parts)


registry.register("TinyDataset", TinyDataset)
registry.register("TinyNet", TinyNet)
registry.register("tiny_class_disjoint_split", tiny_class_disjoint_split)


def tiny_config(**overrides) -> dict:
    """A complete config on the stand-ins: 2 epochs x 3 iterations, train/val/test split."""
    from pml_rank_plugins.config.schema import deep_merge

    cfg = {
        "name": "tiny",
        "seed": 0,
        "dataset": {"TinyDataset": {"num_classes": 12, "per_class": 6}},
        "split": {
            "tiny_class_disjoint_split": {"fractions": [0.5, 0.25, 0.25], "seed": 0},
            "names": ["train", "val", "test"],
        },
        "models": {"trunk": {"TinyNet": {"embedding_dim": 16}}},
        "loss_funcs": {"metric_loss": {"ContrastiveLoss": {}}},
        "sampler": {"MPerClassSampler": {"m": 3, "length_before_new_iter": 36}},
        "optimizers": {"trunk_optimizer": {"Adam": {"lr": 0.01}}},
        "trainer": {
            "MetricLossOnly": {"batch_size": 12, "iterations_per_epoch": 3, "num_epochs": 2}
        },
        "eval": {
            "tester": {"GlobalEmbeddingSpaceTester": {"batch_size": 64}},
            "recall_at_k": [1, 2, 4],
            "validation": ["val"],
            "test": ["test"],
        },
    }
    return deep_merge(cfg, overrides)


# --- Contract stand-ins -------------------------------------------------------------------------
# Signatures copied from the contract in the project brief. Used only where the real class is not
# (yet) importable, so that the shipped configs are validated against the real classes once they
# exist and against the contract before.


class _Loss(torch.nn.Module):
    def __init__(self, **kwargs):
        super().__init__()


class FastAPLoss(_Loss):
    def __init__(self, num_bins=10, **kwargs):
        super().__init__(**kwargs)


class QuantizedAPLoss(_Loss):
    def __init__(self, num_bins=20, class_balanced=False, tie_aware=False, **kwargs):
        super().__init__(**kwargs)


class RankedListLoss(_Loss):
    def __init__(
        self, margin=0.4, alpha=1.2, Tn=10.0, Tp=0.0, lam=1.0, gallery_gradient=False, **kwargs
    ):
        super().__init__(**kwargs)


class CategoryHardSampler:
    def __init__(
        self,
        labels,
        batch_size,
        batches_per_pair=5,
        categories_per_batch=2,
        samples_per_class="all",
        seed=0,
        num_replicas=1,
        rank=0,
    ):
        pass


class RandomClassSampler:
    def __init__(self, labels, batch_size, samples_per_class="all", seed=0, num_replicas=1, rank=0):
        pass


class GlyphDataset:
    def __init__(self, root=None, seed=0, transform=None):
        pass


class OmniglotDataset:
    def __init__(self, path, image_size=28, transform=None):
        pass


class ConvEmbedder(torch.nn.Module):
    def __init__(self, in_channels=1, embedding_dim=64, normalize=False):
        super().__init__()


def class_disjoint_split(labels, fractions=(0.5, 0.5), seed=0):
    return tiny_class_disjoint_split(labels, fractions, seed)


CONTRACT = {
    "pml_rank_plugins.losses": [FastAPLoss, QuantizedAPLoss, RankedListLoss],
    "pml_rank_plugins.samplers": [CategoryHardSampler, RandomClassSampler],
    "pml_rank_plugins.data": [GlyphDataset, OmniglotDataset],
    "pml_rank_plugins.models": [ConvEmbedder],
    "pml_rank_plugins.data.splits": [class_disjoint_split],
}
