from __future__ import annotations

import numpy as np
import pytest

from pml_rank_plugins.data import MatFileError, load_mat

from .matwriter import Cell, Struct, write_mat


@pytest.mark.parametrize("compress", [False, True])
def test_roundtrip(tmp_path, compress):
    variables = {
        "annotations": Struct(
            [
                {"relative_im_path": "car_ims/000001.jpg", "class": 3.0, "test": np.uint8(0)},
                {"relative_im_path": "car_ims/000002.jpg", "class": 196.0, "test": np.uint8(1)},
            ]
        ),
        "class_names": Cell(["AM General Hummer SUV 2000", "Acura RL Sedan 2012"]),
        "matrix": np.array([[1.5, 2.0, -3.0], [4.0, 5.0, 6.25]]),
        "empty": "",
    }
    path = tmp_path / "x.mat"
    write_mat(path, variables, compress=compress)
    mat = load_mat(path)
    assert set(mat) == set(variables)
    ann = mat["annotations"]
    assert ann.shape == (1, 2)
    assert ann[0, 0]["relative_im_path"] == "car_ims/000001.jpg"
    assert ann[0, 1]["class"].item() == 196 and ann[0, 1]["test"].item() == 1
    assert ann[0, 0]["class"].dtype == np.float64  # stored as uint16, class double
    assert mat["class_names"].shape == (1, 2)
    assert mat["class_names"][0, 1] == "Acura RL Sedan 2012"
    assert np.array_equal(mat["matrix"], variables["matrix"])  # column-major restored
    assert mat["empty"] == ""


def test_errors(tmp_path):
    with pytest.raises(MatFileError, match="not found"):
        load_mat(tmp_path / "none.mat")
    (tmp_path / "short.mat").write_bytes(b"MATLAB")
    with pytest.raises(MatFileError, match="too short"):
        load_mat(tmp_path / "short.mat")
    (tmp_path / "text.mat").write_bytes(b"x" * 200)
    with pytest.raises(MatFileError, match="not a level-5"):
        load_mat(tmp_path / "text.mat")
    (tmp_path / "h5.mat").write_bytes(b"\0" * 512 + b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    with pytest.raises(MatFileError, match="v7.3"):
        load_mat(tmp_path / "h5.mat")
    write_mat(tmp_path / "ok.mat", {"a": np.array([[1.5, 2.5]])})
    data = (tmp_path / "ok.mat").read_bytes()
    (tmp_path / "cut.mat").write_bytes(data[:-12])
    with pytest.raises(MatFileError, match="cut.mat"):
        load_mat(tmp_path / "cut.mat")
