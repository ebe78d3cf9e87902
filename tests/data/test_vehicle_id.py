from __future__ import annotations

import pytest

from pml_rank_plugins.data import UNLABELED, DatasetFormatError, VehicleID

from .fixtures import pixel_value, write_image, write_lines

LISTS = {
    "train_list.txt": ["0004839 2", "0004840 2", "0010066 5"],
    "test_list_800.txt": ["0000001 3", "0000002 9"],
    "test_list_1600.txt": ["0000003 11"],
    "test_list_2400.txt": ["0000004 12"],
}
MODELS = ["2 41", "3 0", "12 7"]


def make_tree(root, lists=LISTS, models=MODELS):
    for name, lines in lists.items():
        write_lines(root / "train_test_split" / name, lines)
    write_lines(root / "attribute" / "model_attr.txt", models)
    value = 0
    for lines in lists.values():
        for line in lines:
            value += 10
            write_image(root / "image" / f"{line.split()[0]}.jpg", value)
    return root


def test_splits_and_unlabeled_models(tmp_path):
    root = make_tree(tmp_path)
    train = VehicleID(root, "train")
    assert train.labels.tolist() == [[2, 41], [2, 41], [5, UNLABELED]]
    assert pixel_value(train[2][0]) == 30
    assert VehicleID(root, "test800").labels.tolist() == [[3, 0], [9, UNLABELED]]
    assert VehicleID(root, "test1600").labels.tolist() == [[11, UNLABELED]]
    test2400 = VehicleID(root, "test2400")
    assert test2400.labels.tolist() == [[12, 7]]
    assert pixel_value(test2400[0][0]) == 70


@pytest.mark.parametrize(
    "models,lists,match",
    [
        (["2 41", "3"], LISTS, r"model_attr.txt, line 2: expected 2 fields"),
        (["2 41", "3 x"], LISTS, r"model_attr.txt, line 2: model id is not an integer"),
        (["2 41", "2 40"], LISTS, r"model_attr.txt, line 2: vehicle 2 has two model ids"),
        (["2 -4"], LISTS, r"model_attr.txt, line 1: negative model id"),
        (MODELS, {"train_list.txt": ["0004839 2", "0004840 b"]}, r"train_list.txt, line 2"),
    ],
)
def test_malformed(tmp_path, models, lists, match):
    make_tree(tmp_path, lists=lists, models=models)
    with pytest.raises(DatasetFormatError, match=match):
        VehicleID(tmp_path, "train")


def test_missing(tmp_path):
    make_tree(tmp_path, lists={"train_list.txt": LISTS["train_list.txt"]})
    with pytest.raises(DatasetFormatError, match="test_list_800.txt: annotation file not found"):
        VehicleID(tmp_path, "test800")
    (tmp_path / "attribute" / "model_attr.txt").unlink()
    with pytest.raises(DatasetFormatError, match="model_attr.txt: annotation file not found"):
        VehicleID(tmp_path, "train")
    with pytest.raises(ValueError, match="split"):
        VehicleID(tmp_path, "test")


def test_empty_files_are_errors_not_empty_datasets(tmp_path):
    make_tree(tmp_path, lists={**LISTS, "test_list_800.txt": []})
    with pytest.raises(DatasetFormatError, match=r"test_list_800.txt: no images listed"):
        VehicleID(tmp_path, "test800")
    make_tree(tmp_path, models=[])
    with pytest.raises(DatasetFormatError, match=r"model_attr.txt: no vehicle listed"):
        VehicleID(tmp_path, "train")


def test_image_listed_twice_in_a_split(tmp_path):
    make_tree(tmp_path, lists={**LISTS, "train_list.txt": ["0004839 2", "0004839 5"]})
    with pytest.raises(
        DatasetFormatError, match=r"train_list.txt, line 2: .*already listed at line 1"
    ):
        VehicleID(tmp_path, "train")
