from __future__ import annotations

import pytest
import torch

from pml_rank_plugins.data import DatasetFormatError, StanfordOnlineProducts

from .fixtures import pixel_value, write_image, write_lines

HEADER = "image_id class_id super_class_id path"
TRAIN = [
    "1 1 1 bicycle_final/111085122871_0.JPG",
    "2 1 1 bicycle_final/111085122871_1.JPG",
    "3 2 3 chair_final/111265328556_0.JPG",
]
TEST = ["1 11319 1 bicycle_final/251952414262_0.JPG", "2 11319 1 bicycle_final/251952414262_1.JPG"]


def make_tree(root, train=TRAIN, test=TEST):
    write_lines(root / "Ebay_train.txt", [HEADER] + train)
    write_lines(root / "Ebay_test.txt", [HEADER] + test)
    for i, line in enumerate(train + test):
        write_image(root / line.split()[3], 10 * (i + 1))
    return root


def test_train_and_test(tmp_path):
    root = make_tree(tmp_path)
    train = StanfordOnlineProducts(root, "train")
    assert train.labels.tolist() == [[0, 0], [0, 0], [1, 2]]
    assert train.category_names == ["bicycle_final", None, "chair_final"]
    image, label = train[2]
    assert image.dtype == torch.float32 and image.shape == (3, 4, 6)
    assert pixel_value(image) == 30 and label.tolist() == [1, 2]
    test = StanfordOnlineProducts(root, "test")
    assert test.labels.tolist() == [[11318, 0], [11318, 0]]
    assert pixel_value(test[1][0]) == 50


def test_transform(tmp_path):
    ds = StanfordOnlineProducts(make_tree(tmp_path), transform=lambda img: img.size)
    assert ds[0][0] == (6, 4)


@pytest.mark.parametrize(
    "lines,match",
    [
        (["1 1 1 a.jpg"], "line 1: expected the header"),
        ([HEADER, "1 1 1 a.jpg", "2 x 1 b.jpg"], "line 3: class_id is not an integer"),
        ([HEADER, "1 1 a.jpg"], "line 2: expected 4 fields, got 3"),
        ([HEADER, "1 0 1 a.jpg"], "line 2: class_id and super_class_id start at 1"),
    ],
)
def test_malformed(tmp_path, lines, match):
    write_lines(tmp_path / "Ebay_train.txt", lines)
    with pytest.raises(DatasetFormatError, match=match) as info:
        StanfordOnlineProducts(tmp_path, "train")
    assert "Ebay_train.txt" in str(info.value)


def test_missing_file_and_bad_split(tmp_path):
    with pytest.raises(DatasetFormatError, match="Ebay_test.txt: annotation file not found"):
        StanfordOnlineProducts(tmp_path, "test")
    with pytest.raises(ValueError, match="split"):
        StanfordOnlineProducts(tmp_path, "val")


def test_non_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "Ebay_train.txt"
    path.write_bytes((HEADER + "\n" + TRAIN[0] + "\n").encode() + b"2 1 1 caf\xe9.JPG\n")
    with pytest.raises(DatasetFormatError, match=r"Ebay_train.txt, line 3: not valid UTF-8"):
        StanfordOnlineProducts(tmp_path, "train")


def test_class_under_two_categories_names_file_and_line(tmp_path):
    lines = [
        HEADER,
        "1 1 1 bicycle_final/a.JPG",
        "2 2 3 chair_final/b.JPG",
        "3 1 2 cabinet_final/c.JPG",
    ]
    write_lines(tmp_path / "Ebay_train.txt", lines)
    with pytest.raises(DatasetFormatError, match=r"Ebay_train.txt, line 4: class_id 1 .*line 2"):
        StanfordOnlineProducts(tmp_path, "train")


def test_header_only_is_an_error_not_an_empty_dataset(tmp_path):
    write_lines(tmp_path / "Ebay_train.txt", [HEADER])
    with pytest.raises(DatasetFormatError, match=r"Ebay_train.txt: no images listed after the"):
        StanfordOnlineProducts(tmp_path, "train")


def test_image_listed_twice(tmp_path):
    lines = [HEADER, TRAIN[0], TRAIN[1], "3 2 3 " + TRAIN[0].split()[3]]
    write_lines(tmp_path / "Ebay_train.txt", lines)
    with pytest.raises(DatasetFormatError, match=r"line 4: .*already listed at line 2"):
        StanfordOnlineProducts(tmp_path, "train")
