from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

from pml_rank_plugins.data import DatasetFormatError, OmniglotDataset

from .conftest import shared_dir

SMALL1 = shared_dir() / "data" / "omniglot" / "images_background_small1.zip"


def test_images_background_small1():
    if not SMALL1.is_file():
        pytest.fail(
            f"Omniglot test data missing: {SMALL1} (set PML_RANK_SHARED to the folder holding "
            "data/omniglot/images_background_small1.zip)"
        )
    ds = OmniglotDataset(SMALL1)
    assert len(ds) == 2720
    assert len(np.unique(ds.labels[:, 0])) == 136
    assert len(np.unique(ds.labels[:, 1])) == 5 and len(ds.category_names) == 5
    assert np.all(np.bincount(ds.labels[:, 0]) == 20)  # 20 drawers per character
    assert len(np.unique(ds.labels, axis=0)) == 136  # one alphabet per character
    image, label = ds[0]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32
    assert label.dtype == torch.int64
    # strokes are bright after inversion: most pixels are background (dark)
    assert ds.images.mean() < 128


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


# (set, alphabet, character, image) -> a 10 x 10 image whose value encodes it
TINY = {
    ("images_background", "Zeta", "character01", "a.png"): 10,
    ("images_background", "Zeta", "character01", "b.png"): 20,
    ("images_background", "Alpha", "character02", "c.png"): 30,
    ("images_background", "Alpha", "character01", "d.png"): 40,
    ("images_background", "Alpha", "character01", "e.png"): 50,
}


def _write_tiny_zip(path, entries=TINY):
    with zipfile.ZipFile(path, "w") as archive:
        for parts, value in entries.items():
            archive.writestr("/".join(parts), _png(np.full((10, 10), value)))
    return path


def _expected():
    # alphabets sorted: Alpha=0, Zeta=1; classes sorted by (alphabet, character)
    return {
        10: (2, 1),
        20: (2, 1),
        30: (1, 0),
        40: (0, 0),
        50: (0, 0),
    }


def _check_tiny(ds):
    assert len(ds) == 5
    assert ds.category_names == ["Alpha", "Zeta"]
    assert ds.class_names == ["Alpha/character01", "Alpha/character02", "Zeta/character01"]
    assert ds.images.shape == (5, 6, 6)
    for image, label in (ds[i] for i in range(len(ds))):
        value = round(255 - image[0, 3, 3].item() * 255)  # inverted by default
        assert tuple(label.tolist()) == _expected()[value]


def test_tiny_zip(tmp_path):
    _check_tiny(OmniglotDataset(_write_tiny_zip(tmp_path / "tiny.zip"), image_size=6))


def test_tiny_folder(tmp_path):
    with zipfile.ZipFile(_write_tiny_zip(tmp_path / "tiny.zip")) as archive:
        archive.extractall(tmp_path / "extracted")
    _check_tiny(OmniglotDataset(tmp_path / "extracted", image_size=6))
    # the set folder itself works too
    _check_tiny(OmniglotDataset(tmp_path / "extracted" / "images_background", image_size=6))


def test_no_invert_and_transform(tmp_path):
    path = _write_tiny_zip(tmp_path / "tiny.zip")
    ds = OmniglotDataset(path, image_size=10, invert=False)
    assert sorted(np.unique(ds.images).tolist()) == [10, 20, 30, 40, 50]
    seen = []
    ds = OmniglotDataset(path, transform=lambda img: seen.append(img.size) or torch.ones(1, 2, 2))
    assert ds[0][0].shape == (1, 2, 2) and seen == [(28, 28)]


def test_bad_layout(tmp_path):
    bad = dict(TINY)
    bad[("images_background", "Zeta", "stray.png")] = 5
    with pytest.raises(DatasetFormatError, match="stray.png.*not in the Omniglot layout"):
        OmniglotDataset(_write_tiny_zip(tmp_path / "bad.zip", bad))


def test_missing_and_empty(tmp_path):
    with pytest.raises(DatasetFormatError, match="not found"):
        OmniglotDataset(tmp_path / "nowhere.zip")
    with zipfile.ZipFile(tmp_path / "empty.zip", "w") as archive:
        archive.writestr("readme.txt", "nothing")
    with pytest.raises(DatasetFormatError, match="no Omniglot .png"):
        OmniglotDataset(tmp_path / "empty.zip")
    (tmp_path / "plain.txt").write_text("x")
    with pytest.raises(DatasetFormatError, match="not a zip file or a folder"):
        OmniglotDataset(tmp_path / "plain.txt")


def test_corrupt_png_names_the_member_and_the_zip(tmp_path):
    path = _write_tiny_zip(tmp_path / "tiny.zip")
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("images_background/Zeta/character01/z.png", b"\x89PNG garbage")
    with pytest.raises(DatasetFormatError, match="cannot identify image file") as info:
        OmniglotDataset(path)
    message = str(info.value)
    assert str(path) in message and "images_background/Zeta/character01/z.png" in message
    assert "BytesIO" not in message


def test_truncated_png_in_a_folder_names_the_file(tmp_path):
    folder = tmp_path / "set" / "Alpha" / "character01"
    folder.mkdir(parents=True)
    (folder / "a.png").write_bytes(_png(np.full((10, 10), 10)))
    data = _png(np.random.default_rng(0).integers(0, 256, (40, 40)))
    (folder / "b.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetFormatError) as info:
        OmniglotDataset(tmp_path / "set")
    assert str(folder / "b.png") in str(info.value) and "BytesIO" not in str(info.value)


def test_prepare_image_turns_a_file_into_the_stored_image(tmp_path):
    """What ``pml-rank embed --images`` applies to one's own files (issue 50, item 2): the
    file's PIL image resized to image_size and inverted, as the dataset stores its images."""
    gen = np.random.default_rng(0)
    folder = tmp_path / "images_background" / "Zeta" / "character01"
    folder.mkdir(parents=True)
    pixels = gen.integers(0, 256, (10, 10)).astype(np.uint8)
    Image.fromarray(pixels).save(folder / "a.png")
    for invert in (True, False):
        ds = OmniglotDataset(tmp_path, image_size=6, invert=invert)
        rgb = Image.fromarray(np.repeat(pixels[..., None], 3, axis=2))  # any mode is converted
        got = np.asarray(ds.prepare_image(rgb))
        resized = np.asarray(Image.fromarray(pixels).resize((6, 6), Image.Resampling.BILINEAR))
        np.testing.assert_array_equal(got, 255 - resized if invert else resized)
        np.testing.assert_array_equal(got, ds.images[0])
