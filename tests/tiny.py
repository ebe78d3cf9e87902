"""A tiny user dataset and model, registered like a user's own classes, for runner/CLI tests.

They follow the dataset/model contract (``.labels`` (N, 2), items ``(image (C, H, W), label[2])``)
so the runner is exercised as with ``GlyphDataset``/``ConvEmbedder``, in well under a second per
epoch. Everything else in :func:`tiny_config` (split function, losses, sampler, optimizer,
trainer, tester) is the real class.
"""

from __future__ import annotations

import numpy as np
import torch

from pml_rank_plugins.experiment import registry


class TinyDataset(torch.utils.data.Dataset):
    """``num_classes`` classes x ``per_class`` noisy copies of a random 1x8x8 prototype.

    Class c belongs to category ``c % num_categories``.
    """

    def __init__(self, num_classes=12, per_class=6, num_categories=3, noise=1.5, seed=0):
        gen = torch.Generator().manual_seed(seed)
        # on the host, as a dataset's items are (also under a CUDA default device: TEST_DEVICE)
        protos = torch.randn(num_classes, 1, 8, 8, generator=gen, device="cpu")
        classes = np.repeat(np.arange(num_classes), per_class)
        self.labels = np.stack([classes, classes % num_categories], axis=1).astype(np.int64)
        self.images = protos[classes] + noise * torch.randn(
            len(classes), 1, 8, 8, generator=gen, device="cpu"
        )

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


# override=True: without it register() checks the name against every namespace, torchvision's
# too, and so imports torchvision into every test process and worker that imports this module
# (about 2 s of CPU each; tests/test_import_cost.py). Both names are new.
registry.register("TinyDataset", TinyDataset, override=True)
registry.register("TinyNet", TinyNet, override=True)


def tiny_config(**overrides) -> dict:
    """A complete config on the tiny dataset/model: 2 epochs x 3 iterations, train/val/test split."""
    from pml_rank_plugins.experiment.schema import deep_merge

    cfg = {
        "name": "tiny",
        "seed": 0,
        "dataset": {"TinyDataset": {"num_classes": 12, "per_class": 6}},
        "split": {
            "class_disjoint_split": {"fractions": [0.5, 0.25, 0.25], "seed": 0},
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
