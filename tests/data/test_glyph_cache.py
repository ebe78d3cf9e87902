"""R8 (issue 20): a damaged or stale glyph cache is rebuilt with one warning, never trusted."""

from __future__ import annotations

import warnings
import zipfile

import numpy as np
import pytest

from pml_rank_plugins.data import GlyphDataset
from pml_rank_plugins.data import glyphs as glyphs_module
from pml_rank_plugins.data.glyphs import GlyphCacheWarning

# The smallest set the constructor accepts that still has two classes (so "all labels 0" is wrong).
TINY = dict(images_per_class=2, image_size=8, categories=("digits",), max_classes_per_category=2)


def tiny(root) -> GlyphDataset:
    return GlyphDataset(root=root, **TINY)


def arrays(dataset: GlyphDataset) -> dict[str, np.ndarray]:
    return {
        "images": dataset.images,
        "labels": dataset.labels,
        "class_names": np.array(dataset.class_names, dtype=str),
        "category_names": np.array(dataset.category_names, dtype=str),
    }


def rebuild_after(tmp_path, damage) -> str:
    """Build, ``damage(dataset)`` (its cache file), build again; check the second build equals a fresh
    one, warned exactly once naming the file, and left a valid cache. Returns the warning text."""
    first = tiny(tmp_path / "cache")
    damage(first)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = tiny(tmp_path / "cache")
    fresh = tiny(tmp_path / "fresh")
    assert np.array_equal(again.images, fresh.images)
    assert np.array_equal(again.labels, fresh.labels)
    assert again.class_names == fresh.class_names
    assert again.category_names == fresh.category_names
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert caught[0].category is GlyphCacheWarning
    message = str(caught[0].message)
    assert str(first.cache_path) in message and "rebuilding" in message
    with warnings.catch_warnings(record=True) as later:
        warnings.simplefilter("always")
        reread = tiny(tmp_path / "cache")  # the rebuilt file is read back without complaint
    assert later == [] and np.array_equal(reread.images, fresh.images)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [first.cache_path.name]
    return message


def test_R8_truncated_cache_is_rebuilt_with_one_warning(tmp_path):
    def truncate(dataset):
        path = dataset.cache_path
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    assert "unreadable" in rebuild_after(tmp_path, truncate)


def test_R8_empty_cache_is_rebuilt_with_one_warning(tmp_path):
    assert "empty" in rebuild_after(tmp_path, lambda dataset: dataset.cache_path.write_bytes(b""))


def test_R8_bit_flipped_cache_is_rebuilt_with_one_warning(tmp_path):
    def flip(dataset):
        path = dataset.cache_path
        raw = bytearray(path.read_bytes())
        with zipfile.ZipFile(path) as archive:
            info = archive.getinfo("images.npy")
        # the middle of the compressed image data: past the 30-byte local header, name and extra
        start = info.header_offset + 30 + len(info.filename) + len(info.extra)
        raw[start + info.compress_size // 2] ^= 0x10
        path.write_bytes(bytes(raw))

    assert "unreadable" in rebuild_after(tmp_path, flip)


@pytest.mark.parametrize(
    "signed, reason",
    [
        ("unsigned", "verification record"),  # written by another program
        ("stale", "checksum"),  # the record no longer matches the arrays
        ("resigned", "class labels"),  # a valid record for wrong arrays: the content check
    ],
)
def test_R8_wrong_content_cache_labels_all_zero_is_rebuilt_with_one_warning(
    tmp_path, signed, reason
):
    def zero_labels(dataset):
        data = arrays(dataset)
        data["labels"] = np.zeros_like(data["labels"])
        rewrite(dataset, data, signed)

    assert reason in rebuild_after(tmp_path, zero_labels)


@pytest.mark.parametrize(
    "signed, reason",
    [("unsigned", "verification record"), ("stale", "checksum"), ("resigned", "images are")],
)
def test_R8_wrong_shape_cache_is_rebuilt_with_one_warning(tmp_path, signed, reason):
    def other_shape(dataset):
        data = arrays(dataset)
        data["images"] = np.zeros((len(data["images"]), 10, 10), np.uint8)
        rewrite(dataset, data, signed)

    assert reason in rebuild_after(tmp_path, other_shape)


def rewrite(dataset, data, signed: str) -> None:
    """Overwrite the cache with ``data``: without a record, with the old one, or a new valid one."""
    if signed == "resigned":
        glyphs_module.write_cache(dataset.cache_path, data, dataset.cache_params)
        return
    with np.load(dataset.cache_path) as cached:
        meta = {"meta": cached["meta"]} if signed == "stale" else {}
    np.savez_compressed(dataset.cache_path, **data, **meta)


def test_R8_cache_for_other_parameters_is_rebuilt(tmp_path):
    other = GlyphDataset(root=tmp_path / "other", **dict(TINY, images_per_class=1))

    def copy_other(dataset):
        dataset.cache_path.write_bytes(other.cache_path.read_bytes())

    assert "other parameters" in rebuild_after(tmp_path, copy_other)


def test_R8_every_bit_flip_reads_back_identical_or_is_refused(tmp_path):
    """Flip one bit at each byte of a cache: the reader returns the very same arrays or raises
    InvalidGlyphCache, never another exception and never different data."""
    dataset = tiny(tmp_path)
    expected = arrays(dataset)
    params = dataset.cache_params
    raw = dataset.cache_path.read_bytes()
    damaged = tmp_path / "damaged.npz"
    damaged.write_bytes(raw)
    refused = 0
    with open(damaged, "r+b") as handle:  # flip in place: rewriting the file each time is slow
        for position in range(len(raw)):
            handle.seek(position)
            handle.write(bytes([raw[position] ^ (1 << (position % 8))]))
            handle.flush()
            try:
                data = glyphs_module.read_cache(damaged, params)
            except glyphs_module.InvalidGlyphCache:
                refused += 1
            else:
                assert set(data) == set(expected)
                for name, array in expected.items():
                    assert data[name].dtype == array.dtype, position
                    assert np.array_equal(data[name], array), position
            handle.seek(position)
            handle.write(raw[position : position + 1])
    assert refused > len(raw) // 2
