"""Samplers and splits do not depend on torch's default device (issue 40).

A GPU script often starts with ``torch.set_default_device("cuda")``; a factory call without a
``device`` then lands on the GPU, and one that draws from a CPU ``torch.Generator`` raises
``Expected a 'cuda' device type for generator but found 'cpu'``. There is no GPU in CI, but a draw
that follows a ``meta`` default device gives a tensor without data, which ``.tolist()`` or
``.numpy()`` cannot read, so these tests run every sampler and every split under
``torch.set_default_device("meta")`` and require the very batches they give on the CPU. The PML
trainer cannot run under ``meta`` (its DataLoader reads a seed tensor back), so it runs on the CPU
while every generator draw without a ``device`` is recorded.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pytorch_metric_learning.losses import ContrastiveLoss
from pytorch_metric_learning.trainers import MetricLossOnly
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

from pml_rank_plugins.data import splits
from pml_rank_plugins.samplers import (
    CategoryHardSampler,
    LabeledUnlabeledSampler,
    RandomClassSampler,
)

CLASSES = np.repeat(np.arange(24), 5)
CATEGORIES = np.repeat(np.r_[np.arange(18) % 3, -np.ones(6, int)], 5)
LABELS = np.stack([CLASSES, CATEGORIES], axis=1)

# samples_per_class=3 of 5 items draws a subset of each class (class_pools.fill_part);
# num_replicas=3 pads the epoch with randomly drawn batches (base.epoch_batches)
SAMPLERS = {
    "category_hard": lambda **kw: CategoryHardSampler(
        LABELS, batch_size=12, batches_per_pair=2, samples_per_class=3, **kw
    ),
    "random_class": lambda **kw: RandomClassSampler(
        LABELS, batch_size=12, samples_per_class=3, **kw
    ),
    "labeled_unlabeled": lambda **kw: LabeledUnlabeledSampler(
        LABELS, batch_size=12, samples_per_class=3, **kw
    ),
}


def iterate(make, **kw) -> list:
    """Two epochs through ``iter`` (as a DataLoader does), then ``epoch_batches`` of epoch 5."""
    sampler = make(**kw)
    return [list(sampler), list(sampler), sampler.epoch_batches(5), len(sampler)]


@pytest.mark.parametrize("name", SAMPLERS)
def test_a_sampler_under_the_meta_default_device_gives_its_cpu_batches(name, meta_default_device):
    make = SAMPLERS[name]
    got = [iterate(make, num_replicas=3, rank=r) for r in range(3)]
    torch.set_default_device("cpu")
    want = [iterate(make, num_replicas=3, rank=r) for r in range(3)]
    assert got == want
    assert all(len(batch) == 12 for rank in got for epoch in rank[:3] for batch in epoch)


def test_a_draw_on_the_meta_default_device_cannot_be_read(meta_default_device):
    # the premise of this module: without device="cpu" a sampler's draw fails under meta
    with pytest.raises(NotImplementedError, match="meta"):
        torch.randperm(5, generator=torch.Generator(device="cpu")).tolist()
    assert torch.randperm(5, generator=torch.Generator(), device="cpu").tolist()


def run_splits() -> list:
    labels = torch.as_tensor(LABELS, device="cpu")  # a user's CPU label tensor
    return [
        splits.class_disjoint_split(labels, (0.5, 0.25, 0.25), seed=3),
        splits.first_half_split(LABELS),
        splits.class_disjoint_kfold(CLASSES, 3, seed=1),
        splits.mlrc_protocol(LABELS, num_folds=3, seed=2),
        splits.query_gallery_split(labels, 0.5, seed=4),
    ]


def test_splits_under_the_meta_default_device_equal_their_cpu_splits(meta_default_device):
    got = run_splits()
    torch.set_default_device("cpu")
    want = run_splits()
    np.testing.assert_equal(got, want)


class GeneratorDrawsOnTheDefaultDevice(TorchFunctionMode):
    """Records every tensor factory called with a ``generator`` and no ``device``: on a CUDA default
    device such a call raises ``Expected a 'cuda' device type for generator``."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _device_constructors() and kwargs.get("generator") is not None:
            if kwargs.get("device") is None:
                self.calls.append(func.__name__)
        return func(*args, **kwargs)


class TwoLevelDataset(torch.utils.data.Dataset):
    def __init__(self):
        self.labels = LABELS
        gen = torch.Generator().manual_seed(0)
        self.data = torch.randn(len(LABELS), 6, generator=gen, device="cpu")  # on the host

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.data[i], torch.as_tensor(self.labels[i], device="cpu")


@pytest.mark.parametrize("name", SAMPLERS)
def test_pml_metric_loss_only_with_a_sampler_draws_nothing_on_the_default_device(name):
    # A DataLoader cannot run under the meta default device (it reads a seed tensor back with
    # .item()), so the trainer runs on the CPU while every generator draw that would follow the
    # default device is recorded: a CUDA default device would refuse each of them.
    trunk = torch.nn.Linear(6, 4)
    before = trunk.weight.detach().clone()
    losses = []
    trainer = MetricLossOnly(
        models={"trunk": trunk, "embedder": torch.nn.Identity()},
        optimizers={"trunk_optimizer": torch.optim.SGD(trunk.parameters(), lr=0.1)},
        batch_size=12,
        loss_funcs={"metric_loss": ContrastiveLoss()},
        dataset=TwoLevelDataset(),
        sampler=SAMPLERS[name](),
        iterations_per_epoch=2,
        label_hierarchy_level=0,
        dataloader_num_workers=0,
        end_of_iteration_hook=lambda t: losses.append(float(t.losses["metric_loss"].detach())),
    )
    with GeneratorDrawsOnTheDefaultDevice() as mode:
        trainer.train(num_epochs=1)
    assert mode.calls == []
    assert len(losses) == 2 and not torch.equal(before, trunk.weight)


def test_the_recorder_sees_a_draw_on_the_default_device():
    with GeneratorDrawsOnTheDefaultDevice() as mode:
        torch.randperm(4, generator=torch.Generator(), device="cpu")
        torch.randperm(4, generator=torch.Generator())
    assert mode.calls == ["randperm"]
