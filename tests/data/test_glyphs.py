from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.ft2font import FT2Font
from PIL import Image

from pml_rank_plugins.data import GlyphDataset
from pml_rank_plugins.data import glyphs as glyphs_module

SMALL = dict(categories=("latin_upper", "digits", "arrows"), max_classes_per_category=5)


def small(root, seed=0, images_per_class=3, **kwargs):
    return GlyphDataset(root=root, seed=seed, images_per_class=images_per_class, **SMALL, **kwargs)


def test_full_size_counts(full_glyphs):
    ds = full_glyphs
    classes, per_class = np.unique(ds.labels[:, 0], return_counts=True)
    assert len(classes) >= 300
    assert len(np.unique(ds.labels[:, 1])) >= 8
    assert np.all(per_class == 20)
    assert ds.images.shape == (len(ds), 32, 32) and ds.images.dtype == np.uint8
    assert ds.labels.shape == (len(ds), 2) and ds.labels.dtype == np.int64
    assert len(ds.class_names) == len(classes) and len(set(ds.class_names)) == len(classes)
    assert len(ds.category_names) == ds.labels[:, 1].max() + 1
    # every class lies in exactly one category
    pairs = np.unique(ds.labels, axis=0)
    assert len(pairs) == len(classes)


def test_full_size_characters_are_in_their_blocks_and_fonts(full_glyphs):
    ds = full_glyphs
    ranges = dict(glyphs_module.GLYPH_CATEGORIES)
    fonts = glyphs_module.font_dir()
    charmaps = [set(FT2Font(str(fonts / face)).get_charmap()) for face in glyphs_module.FONT_FACES]
    class_to_cat = dict(np.unique(ds.labels, axis=0).tolist())
    for class_id, char in enumerate(ds.class_names):
        code = ord(char)
        category = ds.category_names[class_to_cat[class_id]]
        assert any(lo <= code <= hi for lo, hi in ranges[category]), (char, category)
        assert sum(code in cm for cm in charmaps) >= 3, char
    # homoglyphs collapse to the first class: Latin A stays, Greek Alpha and Cyrillic A go
    assert "A" in ds.class_names
    assert "\u0391" not in ds.class_names and "\u0410" not in ds.class_names
    # the images carry ink and differ within a class
    assert ds.images.reshape(len(ds), -1).max(axis=1).min() > 100
    first = ds.images[ds.labels[:, 0] == 0].astype(int)
    assert np.abs(first[0] - first[1]).sum() > 0


def test_getitem_contract(tmp_path):
    ds = small(tmp_path)
    image, label = ds[4]
    assert image.dtype == torch.float32 and image.shape == (1, 32, 32)
    assert 0.0 <= image.min() and image.max() <= 1.0
    assert label.dtype == torch.int64 and label.tolist() == ds.labels[4].tolist()
    assert torch.equal(image[0], torch.from_numpy(ds.images[4]).float() / 255)


def test_transform_gets_pil_image(tmp_path):
    seen = []

    def transform(img):
        seen.append((img.mode, img.size))
        return torch.zeros(3, 8, 8)

    ds = small(tmp_path, transform=transform)
    image, _ = ds[0]
    assert seen == [("L", (32, 32))] and image.shape == (3, 8, 8)


def test_small_counts(tmp_path):
    ds = small(tmp_path)
    assert ds.category_names == ["latin_upper", "digits", "arrows"]
    assert len(ds.class_names) == 15 and len(ds) == 45
    assert ds.class_names[:5] == ["A", "G", "M", "T", "Z"]  # 0, 6.25, 12.5, 18.75, 25 rounded
    assert np.bincount(ds.labels[:, 1]).tolist() == [15, 15, 15]


def test_deterministic_for_seed(tmp_path):
    a = small(tmp_path / "a", seed=3)
    b = small(tmp_path / "b", seed=3)
    c = small(tmp_path / "c", seed=4)
    assert np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
    assert not np.array_equal(a.images, c.images)
    assert np.array_equal(a.labels, c.labels)


def test_class_rendering_independent_of_selection(tmp_path):
    both = small(tmp_path / "a")
    only = GlyphDataset(
        root=tmp_path / "b",
        images_per_class=3,
        categories=("latin_upper",),
        max_classes_per_category=5,
    )
    assert np.array_equal(both.images[both.labels[:, 1] == 0], only.images)


def test_cache_reused_and_keyed_by_parameters(tmp_path, monkeypatch):
    first = small(tmp_path)
    assert first.cache_path.is_file() and first.cache_path.parent == tmp_path
    assert not list(tmp_path.glob("*.tmp"))

    def fail(**kwargs):
        raise AssertionError("rendered again despite a cache")

    monkeypatch.setattr(glyphs_module, "render_glyphs", fail)
    again = small(tmp_path)
    assert again.cache_path == first.cache_path
    assert np.array_equal(again.images, first.images)
    with pytest.raises(AssertionError, match="rendered again"):
        small(tmp_path, seed=1)  # another parameter -> another cache file
    with pytest.raises(AssertionError, match="rendered again"):
        small(tmp_path, images_per_class=2)


def test_corrupt_cache_is_rebuilt(tmp_path):
    first = small(tmp_path)
    first.cache_path.write_bytes(b"not an npz")
    with pytest.warns(glyphs_module.GlyphCacheWarning, match="not an .npz archive"):
        again = small(tmp_path)
    assert np.array_equal(again.images, first.images)


def test_default_root_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PML_RANK_CACHE", str(tmp_path))
    ds = GlyphDataset(images_per_class=1, categories=("digits",))
    assert ds.cache_path.parent == tmp_path / "glyphs"
    assert ds.class_names == list("0123456789")


def test_other_image_size(tmp_path):
    ds = small(tmp_path, image_size=24, images_per_class=1)
    assert ds.images.shape == (15, 24, 24)


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown glyph categories"):
        GlyphDataset(root=tmp_path, categories=("klingon",))
    with pytest.raises(ValueError, match="images_per_class"):
        GlyphDataset(root=tmp_path, images_per_class=0)


def test_prepare_image_resizes_a_file_to_the_stored_size(tmp_path):
    """``embed --images`` on a glyph run: a file of another size reaches the model at the
    dataset's image_size, grayscale (issue 50, item 2)."""
    ds = small(tmp_path, image_size=24, images_per_class=1)
    big = Image.fromarray(ds.images[0]).resize((48, 48), Image.Resampling.NEAREST).convert("RGB")
    got = ds.prepare_image(big)
    assert got.mode == "L" and got.size == (24, 24)
    want = np.asarray(big.convert("L").resize((24, 24), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(np.asarray(got), want)
    same = Image.fromarray(ds.images[0])
    np.testing.assert_array_equal(np.asarray(ds.prepare_image(same)), ds.images[0])
