"""load_mat: scipy.io.loadmat behind plain values (MATLAB shapes kept) and errors naming the file."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import scipy.io

from pml_rank_plugins.data import MatFileError, load_mat

from .matwriter import Cell, Struct, write_mat

VARIABLES = {
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


@pytest.mark.parametrize("compress", [False, True])
def test_reads_what_savemat_wrote(tmp_path, compress):
    path = tmp_path / "x.mat"
    write_mat(path, VARIABLES, compress=compress)
    mat = load_mat(path)
    assert set(mat) == set(VARIABLES)  # scipy's __header__ etc. left out
    ann = mat["annotations"]
    assert ann.dtype == object and ann.shape == (1, 2)
    assert ann[0, 0]["relative_im_path"] == "car_ims/000001.jpg"
    assert isinstance(ann[0, 0]["relative_im_path"], str)
    assert ann[0, 1]["class"].item() == 196 and ann[0, 1]["test"].item() == 1
    assert ann[0, 0]["class"].dtype == np.float64 and ann[0, 0]["class"].shape == (1, 1)
    assert mat["class_names"].shape == (1, 2)
    assert mat["class_names"][0, 1] == "Acura RL Sedan 2012"
    assert np.array_equal(mat["matrix"], VARIABLES["matrix"])
    assert mat["empty"] == ""


def test_struct_shape_and_char_rows_are_kept(tmp_path):
    grid = np.empty((2, 3), dtype=[("n", object)])
    for row, col in np.ndindex(grid.shape):
        grid[row, col]["n"] = float(10 * row + col)
    path = tmp_path / "grid.mat"
    scipy.io.savemat(path, {"grid": grid, "rows": np.array(["ab", "cd"])})
    mat = load_mat(path)
    assert mat["grid"].shape == (2, 3)
    assert [[mat["grid"][r, c]["n"].item() for c in range(3)] for r in range(2)] == [
        [0, 1, 2],
        [10, 11, 12],
    ]
    assert mat["rows"] == "ab\ncd"


def test_errors_name_the_file(tmp_path):
    with pytest.raises(MatFileError, match="none.mat: MAT-file not found"):
        load_mat(tmp_path / "none.mat")
    (tmp_path / "short.mat").write_bytes(b"MATLAB")
    with pytest.raises(MatFileError, match="short.mat: .*damaged.*truncated"):
        load_mat(tmp_path / "short.mat")
    (tmp_path / "text.mat").write_bytes(b"x" * 200)
    with pytest.raises(MatFileError, match="text.mat: not a level-5 MAT-file"):
        load_mat(tmp_path / "text.mat")
    (tmp_path / "zeros.mat").write_bytes(b"\0" * 1000)
    with pytest.raises(MatFileError, match="zeros.mat: .*damaged"):
        load_mat(tmp_path / "zeros.mat")
    header = b"MATLAB 7.3 MAT-file".ljust(116) + b"\0" * 8 + struct.pack("<H", 0x0200) + b"IM"
    (tmp_path / "h5.mat").write_bytes(header + b"\0" * 384 + b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    with pytest.raises(MatFileError, match="h5.mat: MATLAB v7.3 .* save it with -v7"):
        load_mat(tmp_path / "h5.mat")
    write_mat(tmp_path / "ok.mat", {"a": np.array([[1.5, 2.5]])})
    data = (tmp_path / "ok.mat").read_bytes()
    (tmp_path / "cut.mat").write_bytes(data[:-12])
    with pytest.raises(MatFileError, match="cut.mat: .*damaged"):
        load_mat(tmp_path / "cut.mat")


@pytest.mark.parametrize("compress", [False, True])
def test_every_truncation_is_refused_or_reads_a_prefix(tmp_path, compress):
    """Cut the file after each byte: load_mat raises MatFileError or returns whole variables."""
    full = tmp_path / "full.mat"
    write_mat(full, VARIABLES, compress=compress)
    raw = full.read_bytes()
    expected = load_mat(full)
    cut = tmp_path / "cut.mat"
    refused = 0
    with open(cut, "wb") as handle:  # grow one file a byte at a time: rewriting each is slow
        for size in range(len(raw)):
            handle.flush()
            try:
                mat = load_mat(cut)
            except MatFileError as err:
                assert str(cut) in str(err)
                refused += 1
            else:  # a cut between variables leaves a valid file of the first ones
                assert list(mat) == list(expected)[: len(mat)], size
                assert all(repr(mat[name]) == repr(expected[name]) for name in mat), size
            handle.write(raw[size : size + 1])
    assert refused > len(raw) // 2
