from __future__ import annotations

import pytest

from pml_rank_plugins.data import CUB200, UNLABELED, DatasetFormatError

from .fixtures import pixel_value, write_image, write_lines

IMAGES = [
    "1 001.Black_footed_Albatross/Black_Footed_Albatross_0046_18.jpg",
    "2 100.Brown_Pelican/Brown_Pelican_0001_94365.jpg",
    "3 101.White_Pelican/White_Pelican_0004_97.jpg",
    "4 200.Common_Yellowthroat/Common_Yellowthroat_0003_190521.jpg",
]
CLASSES = ["1 1", "2 100", "3 101", "4 200"]


def make_tree(root, images=IMAGES, classes=CLASSES):
    write_lines(root / "images.txt", images)
    write_lines(root / "image_class_labels.txt", classes)
    for i, line in enumerate(images):
        write_image(root / "images" / line.split()[1], 10 * (i + 1))
    return root


def test_class_split(tmp_path):
    root = make_tree(tmp_path)
    train = CUB200(root, "train")
    assert train.labels.tolist() == [[0, UNLABELED], [99, UNLABELED]]
    test = CUB200(root, "test")
    assert test.labels.tolist() == [[100, UNLABELED], [199, UNLABELED]]
    assert pixel_value(test[1][0]) == 40 and pixel_value(train[0][0]) == 10
    assert len(CUB200(root, "all")) == 4


@pytest.mark.parametrize(
    "images,classes,match",
    [
        (IMAGES[:2] + ["3"], CLASSES, r"images.txt, line 3: expected 2 fields"),
        (IMAGES + ["1 x.jpg"], CLASSES, r"images.txt, line 5: duplicate image id 1"),
        (IMAGES, ["1 1", "2 x"], r"image_class_labels.txt, line 2: class id is not an integer"),
        (IMAGES, ["1 1", "9 2"], r"image_class_labels.txt, line 2: image id 9 not in images"),
        (IMAGES, ["1 1", "2 201"], r"image_class_labels.txt, line 2: class id 201"),
        (IMAGES, ["1 1", "2 2"], r"image_class_labels.txt: no class for image id\(s\) \[3, 4\]"),
    ],
)
def test_malformed(tmp_path, images, classes, match):
    write_lines(tmp_path / "images.txt", images)
    write_lines(tmp_path / "image_class_labels.txt", classes)
    with pytest.raises(DatasetFormatError, match=match):
        CUB200(tmp_path)


def test_missing(tmp_path):
    with pytest.raises(DatasetFormatError, match="images.txt: annotation file not found"):
        CUB200(tmp_path)
    with pytest.raises(ValueError, match="split"):
        CUB200(tmp_path, "val")


@pytest.mark.parametrize(
    "images,classes,match",
    [
        ([], [], r"images.txt: no images listed"),
        (IMAGES, [], r"image_class_labels.txt: no class listed"),
        (IMAGES, CLASSES + ["2 7"], r"image_class_labels.txt, line 5: image id 2 .* line 2"),
        (IMAGES, CLASSES + ["2 100"], r"image_class_labels.txt, line 5: image id 2 .* line 2"),
    ],
)
def test_empty_or_inconsistent_files(tmp_path, images, classes, match):
    write_lines(tmp_path / "images.txt", images)
    write_lines(tmp_path / "image_class_labels.txt", classes)
    with pytest.raises(DatasetFormatError, match=match):
        CUB200(tmp_path)


def test_split_without_images_is_an_error(tmp_path):
    root = make_tree(tmp_path, images=IMAGES[:2], classes=CLASSES[:2])
    assert len(CUB200(root, "train")) == 2
    with pytest.raises(
        DatasetFormatError, match=r"image_class_labels.txt: no image of split 'test'"
    ):
        CUB200(root, "test")
