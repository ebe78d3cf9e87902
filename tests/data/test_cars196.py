from __future__ import annotations

import numpy as np
import pytest

from pml_rank_plugins.data import UNLABELED, Cars196, DatasetFormatError

from .fixtures import pixel_value, write_image
from .matwriter import Cell, Struct, write_mat


def annotation(i, cls):
    return {
        "relative_im_path": f"car_ims/{i:06d}.jpg",
        "bbox_x1": 30.0,
        "bbox_y1": 52.0,
        "bbox_x2": 246.0,
        "bbox_y2": 147.0,
        "class": float(cls),
        "test": np.uint8(i % 2),
    }


ANNOTATIONS = [annotation(1, 1), annotation(2, 98), annotation(3, 99), annotation(4, 196)]


def make_tree(root, annotations=ANNOTATIONS, compress=True, **extra):
    names = Cell([f"Make{k} Model {k}" for k in range(1, 197)])
    write_mat(
        root / "cars_annos.mat",
        {"annotations": Struct(annotations), "class_names": names, **extra},
        compress,
    )
    for k, record in enumerate(annotations):
        write_image(root / record["relative_im_path"], 10 * (k + 1))
    return root


@pytest.mark.parametrize("compress", [False, True])
def test_class_split(tmp_path, compress):
    root = make_tree(tmp_path, compress=compress)
    train = Cars196(root, "train")
    assert train.labels.tolist() == [[0, UNLABELED], [97, UNLABELED]]
    test = Cars196(root, "test")
    assert test.labels.tolist() == [[98, UNLABELED], [195, UNLABELED]]
    assert pixel_value(test[0][0]) == 30 and pixel_value(train[1][0]) == 20
    assert len(Cars196(root, "all")) == 4
    assert len(train.class_names) == 196 and train.class_names[1] == "Make2 Model 2"


def test_malformed(tmp_path):
    bad = [dict(annotation(1, 1)), annotation(2, 197)]
    make_tree(tmp_path, bad)
    with pytest.raises(DatasetFormatError, match=r"cars_annos.mat: annotations\(2\).class = 197"):
        Cars196(tmp_path)
    no_class = [{k: v for k, v in annotation(1, 1).items() if k != "class"}]
    make_tree(tmp_path, no_class)
    with pytest.raises(DatasetFormatError, match=r"annotations\(1\) lacks field\(s\) \['class'\]"):
        Cars196(tmp_path)
    write_mat(tmp_path / "cars_annos.mat", {"other": np.array([[1.0]])})
    with pytest.raises(DatasetFormatError, match="no struct array 'annotations'"):
        Cars196(tmp_path)
    (tmp_path / "cars_annos.mat").write_bytes(b"garbage" * 40)
    with pytest.raises(DatasetFormatError, match="cars_annos.mat: not a level-5"):
        Cars196(tmp_path)
    make_tree(tmp_path)
    data = (tmp_path / "cars_annos.mat").read_bytes()
    (tmp_path / "cars_annos.mat").write_bytes(data[: len(data) // 2])  # an interrupted download
    with pytest.raises(DatasetFormatError, match="cars_annos.mat: .*damaged"):
        Cars196(tmp_path)


def test_missing(tmp_path):
    with pytest.raises(DatasetFormatError, match="cars_annos.mat: annotation file not found"):
        Cars196(tmp_path)
    with pytest.raises(ValueError, match="split"):
        Cars196(tmp_path, "val")


def test_empty_annotations_and_empty_split_are_errors(tmp_path):
    make_tree(tmp_path, annotations=ANNOTATIONS[:2])
    assert len(Cars196(tmp_path, "train")) == 2
    with pytest.raises(DatasetFormatError, match=r"cars_annos.mat: no image of split 'test'"):
        Cars196(tmp_path, "test")


def test_image_listed_twice(tmp_path):
    make_tree(tmp_path, annotations=ANNOTATIONS + [annotation(1, 5)])
    with pytest.raises(DatasetFormatError, match=r"annotations\(5\) repeats .*annotations\(1\)"):
        Cars196(tmp_path, "all")
