from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms.functional import to_tensor

from pml_rank_plugins.data import DatasetFormatError, ImageListDataset
from pml_rank_plugins.data.images import read_rows, to_float_tensor

from .fixtures import write_image, write_lines


@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_to_float_tensor_matches_torchvision(mode):
    rng = np.random.default_rng(0)
    shape = (5, 7) if mode == "L" else (5, 7, 3)
    image = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8))
    assert image.mode == mode
    assert torch.equal(to_float_tensor(image), to_tensor(image))


def test_image_list_dataset(tmp_path):
    write_image(tmp_path / "a.png", 51)
    write_image(tmp_path / "sub" / "b.png", 102)
    ds = ImageListDataset(["a.png", "sub/b.png"], [[3, 1], [4, -1]], root=tmp_path)
    image, label = ds[1]
    assert image.shape == (3, 4, 6) and torch.allclose(image, torch.full_like(image, 0.4))
    assert label.dtype == torch.int64 and label.tolist() == [4, -1]
    gray = ImageListDataset([tmp_path / "a.png"], [[0, 0]], mode="L")
    assert gray[0][0].shape == (1, 4, 6)
    with pytest.raises(ValueError, match="2 paths but 1 labels"):
        ImageListDataset(["a.png", "b.png"], [[0, 0]])
    with pytest.raises(ValueError, match="more than one category"):
        ImageListDataset(["a.png", "b.png"], [[0, 0], [0, 1]])


def test_read_rows(tmp_path):
    path = write_lines(tmp_path / "x.txt", ["h e a d", "1 2", "", "3 4"])
    assert read_rows(path, 2, skip=1) == [(2, ["1", "2"]), (4, ["3", "4"])]
    with pytest.raises(DatasetFormatError, match=r"x.txt, line 1: expected 2 fields, got 4"):
        read_rows(path, 2)


def _jpeg_bytes(size=(32, 24)) -> bytes:
    buffer = io.BytesIO()
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    "content,problem",
    [
        (b"not an image at all", "cannot identify image file"),
        (_jpeg_bytes()[:200], "(?i)truncated"),
        (b"", "cannot identify image file"),
    ],
)
def test_unreadable_image_names_the_file(tmp_path, content, problem):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "bad.jpg").write_bytes(content)
    ds = ImageListDataset(["sub/bad.jpg"], [[0, 0]], root=tmp_path)
    with pytest.raises(DatasetFormatError, match=problem) as info:
        ds[0]
    message = str(info.value)
    assert str(tmp_path / "sub" / "bad.jpg") in message and "BytesIO" not in message


def test_missing_image_names_the_file(tmp_path):
    ds = ImageListDataset(["gone.jpg"], [[0, 0]], root=tmp_path)
    with pytest.raises(DatasetFormatError, match=r"gone.jpg: image file not found"):
        ds[0]


def test_read_rows_non_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes(b"1 2\n3 caf\xe9\n")
    with pytest.raises(DatasetFormatError, match=r"x.txt, line 2: not valid UTF-8"):
        read_rows(path, 2)


def test_scan_names_every_listed_image_whose_header_cannot_be_read(tmp_path):
    # issue 50: a non-image file surfaced only after the first epoch's iterations
    Image.new("RGB", (4, 3)).save(tmp_path / "good.png")
    (tmp_path / "text.jpg").write_text("not a jpeg")
    (tmp_path / "empty.png").write_bytes(b"")
    paths = ["good.png", "text.jpg", "missing.png", "empty.png"]
    ds = ImageListDataset(paths, [[0, 0], [0, 0], [1, 0], [1, 0]], root=tmp_path)
    calls = []
    problems = ds.scan(progress=lambda done, total: calls.append((done, total)))
    assert [p for p, _ in problems] == [str(tmp_path / p) for p in paths[1:]]
    reasons = [r for _, r in problems]
    assert "cannot identify image file" in reasons[0] and "cannot identify" in reasons[2]
    assert reasons[1] == "image file not found"
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert ImageListDataset(paths[:1], [[0, 0]], root=tmp_path).scan() == []
