"""LandmarksList on list files written by the tests."""

from __future__ import annotations

import pytest

from pml_rank_plugins.data import DatasetFormatError, LandmarksList

from .fixtures import pixel_value, write_image, write_lines

LINES = [
    "# retrieval-SfM style list: path label [category]",
    "",
    "ims/a/0001.jpg 0",
    "  ims/a/0002.jpg 0  ",
    "ims/b/0003.jpg 7 2",
    "\t",
    "ims/b/0004.jpg 7 2",
    "ims/c/#5.jpg 3 -1",
]


def make_tree(root, lines=LINES, list_name="train.txt"):
    write_lines(root / list_name, lines)
    for i, line in enumerate(x for x in lines if x.strip() and not x.strip().startswith("#")):
        write_image(root / line.split()[0], 10 * (i + 1))
    return root


def test_reads_paths_labels_and_optional_categories(tmp_path):
    root = make_tree(tmp_path)
    ds = LandmarksList(root, "train.txt")
    assert [str(p) for p in ds.paths] == [
        "ims/a/0001.jpg",
        "ims/a/0002.jpg",
        "ims/b/0003.jpg",
        "ims/b/0004.jpg",
        "ims/c/#5.jpg",
    ]
    assert ds.labels.tolist() == [[0, -1], [0, -1], [7, 2], [7, 2], [3, -1]]
    image, label = ds[3]
    assert image.shape == (3, 4, 6) and pixel_value(image) == 40 and label.tolist() == [7, 2]
    # an absolute list file anywhere works too; paths stay relative to root
    (tmp_path / "lists").mkdir()
    moved = (tmp_path / "train.txt").rename(tmp_path / "lists" / "l.txt")
    assert len(LandmarksList(root, moved, transform=lambda img: img.size)) == 5


@pytest.mark.parametrize(
    "lines,match",
    [
        (["a.jpg"], r"line 1: expected 'path label \[category\]' \(2 or 3 fields\), got 1"),
        (["a.jpg 1", "b.jpg 1 2 3"], r"line 2: expected .* got 4"),
        (["a.jpg x"], r"line 1: label is not an integer: 'x'"),
        (["a.jpg -2"], r"line 1: label must be >= 0"),
        (["a.jpg 1 z"], r"line 1: category is not an integer"),
        (["a.jpg 1 -3"], r"line 1: category must be >= -1"),
        (["a.jpg 1 4", "# c", "b.jpg 1 5"], r"line 3: label 1 is under category 5 .* line 1"),
        (
            ["a.jpg 1", "b.jpg 1 0"],
            r"line 2: label 1 is under category 0 here but under category -1",
        ),
        (["a.jpg 1", "a.jpg 2"], r"line 2: 'a.jpg' is already listed at line 1"),
        (["/abs/a.jpg 1"], r"line 1: path '/abs/a.jpg' must be relative"),
        (["../up.jpg 1"], r"line 1: path '../up.jpg' must be relative"),
        (["# only a comment", ""], r"train.txt: no images listed"),
        ([], r"train.txt: no images listed"),
    ],
)
def test_malformed_lists_name_file_and_line(tmp_path, lines, match):
    write_lines(tmp_path / "train.txt", lines)
    with pytest.raises(DatasetFormatError, match=match) as info:
        LandmarksList(tmp_path, "train.txt")
    assert "train.txt" in str(info.value)


def test_missing_list_non_utf8_and_missing_image(tmp_path):
    with pytest.raises(DatasetFormatError, match=r"nope.txt: image list not found"):
        LandmarksList(tmp_path, "nope.txt")
    (tmp_path / "bad.txt").write_bytes(b"a.jpg 1\nb\xff.jpg 2\n")
    with pytest.raises(DatasetFormatError, match=r"bad.txt, line 2: not valid UTF-8"):
        LandmarksList(tmp_path, "bad.txt")
    write_lines(tmp_path / "ok.txt", ["gone.jpg 1"])
    ds = LandmarksList(tmp_path, "ok.txt")  # images are opened lazily
    with pytest.raises(DatasetFormatError, match=r"gone.jpg: image file not found"):
        ds[0]
