from __future__ import annotations

import pytest

from pml_rank_plugins.data import DatasetFormatError, InShopClothes

from .fixtures import pixel_value, write_image, write_lines

HEADER = "image_name item_id evaluation_status"
ROWS = [
    "img/WOMEN/Dresses/id_00000002/02_1_front.jpg id_00000002 train",
    "img/WOMEN/Dresses/id_00000002/02_2_side.jpg id_00000002 train",
    "img/MEN/Denim/id_00000080/01_1_front.jpg id_00000080 train",
    "img/WOMEN/Blouses_Shirts/id_00000001/02_1_front.jpg id_00000001 query",
    "img/WOMEN/Blouses_Shirts/id_00000001/02_2_side.jpg id_00000001 gallery",
    "img/MEN/Denim/id_00000007/01_1_front.jpg id_00000007 gallery",
]
# sorted categories: MEN/Denim=0, WOMEN/Blouses_Shirts=1, WOMEN/Dresses=2


def make_tree(root, rows=ROWS, eval_dir=False, img_dir=False):
    listing = (
        root / "Eval" / "list_eval_partition.txt" if eval_dir else root / "list_eval_partition.txt"
    )
    write_lines(listing, [str(len(rows)), HEADER] + rows)
    for i, row in enumerate(rows):
        write_image((root / "Img" if img_dir else root) / row.split()[0], 10 * (i + 1))
    return root


def test_splits(tmp_path):
    root = make_tree(tmp_path)
    train = InShopClothes(root, "train")
    assert train.category_names == ["MEN/Denim", "WOMEN/Blouses_Shirts", "WOMEN/Dresses"]
    assert train.labels.tolist() == [[2, 2], [2, 2], [80, 0]]
    query = InShopClothes(root, "query")
    gallery = InShopClothes(root, "gallery")
    assert query.labels.tolist() == [[1, 1]]
    assert gallery.labels.tolist() == [[1, 1], [7, 0]]
    assert pixel_value(query[0][0]) == 40 and pixel_value(gallery[1][0]) == 60


def test_published_archive_layout(tmp_path):
    root = make_tree(tmp_path, eval_dir=True, img_dir=True)
    gallery = InShopClothes(root, "gallery")
    assert pixel_value(gallery[0][0]) == 50


@pytest.mark.parametrize(
    "lines,match",
    [
        (["six", HEADER] + ROWS, "line 1: expected the image count"),
        (["6", "name id status"] + ROWS, "line 2: expected the header"),
        (["5", HEADER] + ROWS, "line 1: says 5 images but lists 6"),
        (["1", HEADER, "img/MEN/Denim/id_00000007/a.jpg id_00000007 val"], "line 3: unknown"),
        (["1", HEADER, "img/MEN/Denim/id_00000007/a.jpg 00000007 train"], "line 3: item_id"),
        (["1", HEADER, "img/MEN/id_00000007/a.jpg id_00000007 train"], "line 3: image path"),
        (["1", HEADER, "img/MEN/Denim/id_00000007/a.jpg id_00000007"], "line 3: expected 3"),
    ],
)
def test_malformed(tmp_path, lines, match):
    write_lines(tmp_path / "list_eval_partition.txt", lines)
    with pytest.raises(DatasetFormatError, match=match) as info:
        InShopClothes(tmp_path, "train")
    assert "list_eval_partition.txt" in str(info.value)


def test_missing(tmp_path):
    with pytest.raises(DatasetFormatError, match="list_eval_partition.txt: annotation file not"):
        InShopClothes(tmp_path, "query")
    with pytest.raises(ValueError, match="split"):
        InShopClothes(tmp_path, "test")


def test_empty_list_and_empty_split_are_errors(tmp_path):
    write_lines(tmp_path / "list_eval_partition.txt", ["0", HEADER])
    with pytest.raises(DatasetFormatError, match=r"list_eval_partition.txt: no images listed"):
        InShopClothes(tmp_path, "train")
    root = make_tree(tmp_path, rows=[r for r in ROWS if not r.endswith("query")])
    with pytest.raises(
        DatasetFormatError, match=r"list_eval_partition.txt: no image of split 'query'"
    ):
        InShopClothes(root, "query")


def test_image_listed_twice(tmp_path):
    make_tree(tmp_path, rows=ROWS + [ROWS[0].replace(" train", " gallery")])
    with pytest.raises(DatasetFormatError, match=r"line 9: .*already listed at line 3"):
        InShopClothes(tmp_path, "train")


def test_item_under_two_categories(tmp_path):
    make_tree(tmp_path, rows=ROWS + ["img/MEN/Tees/id_00000080/03_1_front.jpg id_00000080 train"])
    with pytest.raises(DatasetFormatError, match=r"line 9: item 80 is under category 'MEN/Tees'"):
        InShopClothes(tmp_path, "train")
