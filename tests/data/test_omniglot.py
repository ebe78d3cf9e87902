import io
import zipfile

import numpy as np
import pytest
from PIL import Image

from pml_rank_plugins.data import OmniglotDataset

from .shared_data import shared_dir


def test_real_small1_zip():
    dataset = OmniglotDataset(shared_dir() / "data" / "omniglot" / "images_background_small1.zip")
    assert len(dataset) == 2720
    assert len(np.unique(dataset.labels[:, 0])) == 136
    assert len(dataset.category_names) == 5 and "Latin" in dataset.category_names
    image, label = dataset[0]
    assert image.shape == (1, 28, 28)
    assert label.tolist() == dataset.labels[0].tolist()


def _png(value):
    buffer = io.BytesIO()
    Image.new("L", (10, 10), value).save(buffer, format="PNG")
    return buffer.getvalue()


def tiny_zip(path):
    with zipfile.ZipFile(path, "w") as archive:
        for alphabet in ["Beta", "Alpha"]:
            for character in ["character01", "character02"]:
                for drawer in range(3):
                    name = f"images_background/{alphabet}/{character}/{drawer:04d}_01.png"
                    archive.writestr(name, _png(200))


def test_tiny_zip_and_extracted_folder_agree(tmp_path):
    tiny_zip(tmp_path / "tiny.zip")
    from_zip = OmniglotDataset(tmp_path / "tiny.zip", image_size=8)
    assert from_zip.category_names == ["Alpha", "Beta"]
    assert from_zip.class_names[0] == "Alpha/character01"
    assert from_zip.labels.tolist() == [[c, c // 2] for c in range(4) for _ in range(3)]
    assert from_zip.images.shape == (12, 8, 8)
    assert (from_zip.images == 255 - 200).all()  # inverted: strokes bright
    zipfile.ZipFile(tmp_path / "tiny.zip").extractall(tmp_path / "folder")
    from_folder = OmniglotDataset(tmp_path / "folder", image_size=8)
    np.testing.assert_array_equal(from_folder.labels, from_zip.labels)
    np.testing.assert_array_equal(from_folder.images, from_zip.images)


def test_missing_and_empty_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        OmniglotDataset(tmp_path / "nope.zip")
    with zipfile.ZipFile(tmp_path / "empty.zip", "w") as archive:
        archive.writestr("readme.txt", "nothing")
    with pytest.raises(ValueError, match="no images"):
        OmniglotDataset(tmp_path / "empty.zip")
