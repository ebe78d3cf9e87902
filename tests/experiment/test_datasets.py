"""``experiment.datasets.build_dataset``: what a dataset without ``.labels`` is told."""

from __future__ import annotations

import pytest
import torch

from pml_rank_plugins.experiment import registry
from pml_rank_plugins.experiment.datasets import build_dataset
from pml_rank_plugins.experiment.schema import ConfigError


class NoLabels(torch.utils.data.Dataset):
    """A torchvision-like dataset: items, but no ``.labels`` array."""

    def __len__(self):
        return 1

    def __getitem__(self, index):
        return torch.zeros(1, 2, 2), 0


def test_a_dataset_without_labels_is_pointed_to_the_readers_that_have_them():
    # issue 50: "the dataset must expose .labels" said nothing of what works
    registry.register("NoLabels", NoLabels, override=True)
    try:
        with pytest.raises(ConfigError, match=r"^dataset: the dataset must expose \.labels") as err:
            build_dataset({}, {"NoLabels": {}}, "dataset")
    finally:
        registry.unregister("NoLabels")
    for fix in ("ImageFolderDataset: {root: DIR}", "LandmarksList", "as_two_level"):
        assert fix in str(err.value)
