"""``NamedCompose`` keeps torchvision ``Compose``'s contract without subclassing it (so that
importing the runner does not import torchvision), and ``build_transforms`` builds it per split."""

from __future__ import annotations

import pickle

import pytest
import torch
import torchvision

from pml_rank_plugins.experiment import UnknownNameError
from pml_rank_plugins.experiment.schema import ConfigError
from pml_rank_plugins.experiment.transforms import NamedCompose, build_transforms


def test_named_compose_calls_in_order_like_torchvision_compose():
    steps = [lambda x: x + 1, lambda x: x * 10, str]
    ours, theirs = NamedCompose(steps, "transforms.eval"), torchvision.transforms.Compose(steps)
    assert ours(2) == theirs(2) == "30"  # (2 + 1) * 10: the order matters
    assert ours.transforms is steps and ours.key == "transforms.eval"


@pytest.mark.parametrize("steps", [[], [torchvision.transforms.CenterCrop(4)]])
def test_named_compose_repr_is_torchvisions_with_its_own_class_name(steps):
    theirs = repr(torchvision.transforms.Compose(steps))
    assert repr(NamedCompose(steps, "k")) == "Named" + theirs


def test_built_transforms_survive_pickling_for_dataloader_workers():
    config = {"transforms": {"eval": [{"CenterCrop": {"size": 4}}, {"Normalize": {
        "mean": [0.5], "std": [0.25]}}]}}  # fmt: skip
    built = build_transforms(config)
    assert built["train"].key == "transforms.eval"  # no train list: the eval list is used
    image = torch.rand(1, 8, 8)
    expected = (image[:, 2:6, 2:6] - 0.5) / 0.25
    copy = pickle.loads(pickle.dumps(built["eval"]))
    assert copy.key == "transforms.eval"
    torch.testing.assert_close(copy(image), expected)
    torch.testing.assert_close(built["eval"](image), expected)


def test_an_unknown_transform_names_its_key():
    with pytest.raises(UnknownNameError, match=r"'Resise' at transforms\.train\[1\].*: Resize"):
        build_transforms({"transforms": {"train": [{"ToTensor": {}}, {"Resise": {}}], "eval": []}})
    with pytest.raises(ConfigError, match="needs an 'eval' list"):
        build_transforms({"transforms": {"train": []}})
