"""Every sampler drives a PML MetricLossOnly trainer (which passes BatchSamplers as batch_sampler)."""

import numpy as np
import pytest
import torch
from pytorch_metric_learning.losses import ContrastiveLoss
from pytorch_metric_learning.trainers import MetricLossOnly

from pml_rank_plugins.samplers import (
    CategoryHardSampler,
    LabeledUnlabeledSampler,
    RandomClassSampler,
)


class TwoLevelDataset(torch.utils.data.Dataset):
    def __init__(self, labels):
        self.labels = labels
        gen = torch.Generator().manual_seed(0)
        self.data = torch.randn(len(labels), 6, generator=gen, device="cpu")  # on the host

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.data[i], torch.as_tensor(self.labels[i], device="cpu")


CLASSES = np.repeat(np.arange(24), 4)
CATEGORIES = np.repeat(np.r_[np.arange(18) % 3, -np.ones(6, int)], 4)


@pytest.mark.parametrize(
    "make_sampler",
    [
        lambda labels: CategoryHardSampler(labels, batch_size=16, batches_per_pair=1),
        lambda labels: RandomClassSampler(labels, batch_size=16),
        lambda labels: LabeledUnlabeledSampler(labels, batch_size=16),
    ],
    ids=["category_hard", "random_class", "labeled_unlabeled"],
)
def test_metric_loss_only_trains_with_sampler(make_sampler):
    labels = np.stack([CLASSES, CATEGORIES], axis=1)
    dataset = TwoLevelDataset(labels)
    sampler = make_sampler(labels)
    seen_batches = []

    class Trunk(torch.nn.Linear):
        def forward(self, x):
            seen_batches.append(len(x))
            return super().forward(x)

    losses = []
    trunk = Trunk(6, 4)
    before = trunk.weight.detach().clone()
    trainer = MetricLossOnly(
        models={"trunk": trunk, "embedder": torch.nn.Identity()},
        optimizers={"trunk_optimizer": torch.optim.SGD(trunk.parameters(), lr=0.1)},
        batch_size=16,
        loss_funcs={"metric_loss": ContrastiveLoss()},
        dataset=dataset,
        sampler=sampler,
        iterations_per_epoch=3,
        label_hierarchy_level=0,
        dataloader_num_workers=0,
        end_of_iteration_hook=lambda t: losses.append(t.losses["metric_loss"].item()),
    )
    trainer.train(num_epochs=1)
    assert isinstance(trainer.dataloader.batch_sampler, type(sampler))
    assert seen_batches == [16, 16, 16]
    assert not torch.equal(before, trunk.weight)
    assert len(losses) == 3 and all(loss > 0 for loss in losses)
