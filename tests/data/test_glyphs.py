import time

import numpy as np
import pytest
import torch

from pml_rank_plugins.data import GlyphDataset


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    root = tmp_path_factory.mktemp("glyphs")
    start = time.perf_counter()
    dataset = GlyphDataset(root=root, seed=0)
    return dataset, root, time.perf_counter() - start


def test_counts_and_shapes(full):
    dataset, _, build_seconds = full
    classes, counts = np.unique(dataset.labels[:, 0], return_counts=True)
    assert len(classes) >= 300 and (counts == 20).all()
    assert len(np.unique(dataset.labels[:, 1])) >= 8
    assert dataset.images.shape == (len(dataset), 32, 32) and dataset.images.dtype == np.uint8
    assert len(dataset.class_names) == len(classes)
    assert build_seconds < 60  # 30 s target on 2 idle cores; slack for a loaded CI machine
    image, label = dataset[5]
    assert image.shape == (1, 32, 32) and image.dtype == torch.float32
    assert 0 <= image.min() and image.max() <= 1
    assert label.tolist() == dataset.labels[5].tolist()


def test_every_class_has_one_category(full):
    dataset, _, _ = full
    pairs = np.unique(dataset.labels, axis=0)
    assert len(np.unique(pairs[:, 0])) == len(pairs)


def test_cache_hit_reloads_identical_arrays(full):
    dataset, root, _ = full
    again = GlyphDataset(root=root, seed=0)
    assert again.cache_path == dataset.cache_path
    np.testing.assert_array_equal(again.images, dataset.images)
    np.testing.assert_array_equal(again.labels, dataset.labels)
    assert again.class_names == dataset.class_names


def test_deterministic_for_a_seed_and_different_across_seeds(tmp_path):
    kwargs = dict(max_classes_per_category=2, images_per_class=3)
    a = GlyphDataset(root=tmp_path / "a", seed=1, **kwargs)
    b = GlyphDataset(root=tmp_path / "b", seed=1, **kwargs)
    c = GlyphDataset(root=tmp_path / "a", seed=2, **kwargs)
    np.testing.assert_array_equal(a.images, b.images)
    assert c.cache_path != a.cache_path
    assert not np.array_equal(a.images, c.images)
    np.testing.assert_array_equal(a.labels, c.labels)


def test_transform_receives_pil_image(tmp_path):
    dataset = GlyphDataset(
        root=tmp_path, max_classes_per_category=1, images_per_class=2, transform=lambda im: im.size
    )
    assert dataset[0][0] == (32, 32)


@pytest.mark.parametrize("kwargs", [dict(images_per_class=1), dict(image_size=4)])
def test_bad_arguments(tmp_path, kwargs):
    with pytest.raises(ValueError):
        GlyphDataset(root=tmp_path, **kwargs)
