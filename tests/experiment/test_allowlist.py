"""``experiment.allowlist.is_under`` and its remembered twin ``is_under_cached`` (used by the
registry's scans on every lookup): the same answers, a dotted boundary, tuples only."""

from __future__ import annotations

import pytest

from pml_rank_plugins.experiment.allowlist import UnknownNameError, is_under, is_under_cached
from pml_rank_plugins.experiment.registry import resolve

CASES = [
    ("torch", ("torch",), True),  # the module itself
    ("torch.nn.modules", ("torch.nn",), True),  # a submodule
    ("torchvision", ("torch",), False),  # a longer name is not a submodule
    ("pytorch_metric_learning.losses", ("torch", "pytorch_metric_learning"), True),
    ("pml_rank_plugins", ("pml_rank_plugins.losses",), False),  # the parent is not under it
    ("os", (), False),
]


@pytest.mark.parametrize("module, prefixes, expected", CASES)
def test_is_under_and_its_cached_twin_agree(module, prefixes, expected):
    assert is_under(module, prefixes) is expected
    assert is_under_cached(module, prefixes) is expected
    before = is_under_cached.cache_info().hits
    assert is_under_cached(module, prefixes) is expected  # asked again: remembered
    assert is_under_cached.cache_info().hits == before + 1


def test_the_cached_twin_takes_tuples_only():
    assert is_under("a.b", ["a"])  # any iterable
    with pytest.raises(TypeError, match="unhashable"):
        is_under_cached("a.b", ["a"])


def test_torchvisions_image_folder_refusal_points_to_image_folder_dataset():
    # issue 50: the refusal named no reader that works for a folder of class sub-folders
    with pytest.raises(UnknownNameError, match="outside the namespaces") as err:
        resolve("torchvision.datasets.ImageFolder", "dataset")
    assert "ImageFolderDataset: {root: DIR}" in str(err.value)
    with pytest.raises(UnknownNameError) as other:  # another module: no dataset advice
        resolve("numpy.random.default_rng", "split")
    assert "ImageFolderDataset" not in str(other.value)
