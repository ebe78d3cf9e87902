"""``pml-rank check`` reads the data (issue 50, item 3): every image file's header, unreadable
ones an error naming them all, files the data does not use listed, a progress bar on large sets,
``--no-scan``; image-list datasets and any dataset with a ``scan`` method alike."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from PIL import Image

from pml_rank_plugins import cli
from pml_rank_plugins.data import ImageFolderDataset, LandmarksList
from pml_rank_plugins.experiment import check_configs, data_scan
from pml_rank_plugins.experiment.data_scan import DataScan, DataScanError
from tests.data.image_folder_fixture import make_image_folder
from tests.tiny import tiny_config


def folder_config(root, **sampler) -> dict:
    """The tiny config on an ImageFolderDataset at ``root`` (3 x 8 x 8 after the transform)."""
    cfg = tiny_config()
    cfg["dataset"] = {"ImageFolderDataset": {"root": str(root), "category_folders": True}}
    cfg.pop("split")
    cfg["transforms"] = {"eval": [{"Resize": {"size": [8, 8]}}, {"ToTensor": {}}]}
    cfg["models"] = {"trunk": {"TinyNet": {"in_features": 192, "embedding_dim": 16}}}
    cfg["sampler"] = sampler or {"MPerClassSampler": {"m": 4, "length_before_new_iter": 12}}
    cfg["eval"].update(validation=[], test=[])
    return cfg


def _write(tmp_path, cfg) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_a_clean_folder_reads_every_image_and_lists_the_empty_class_folder(tmp_path):
    folder = make_image_folder(tmp_path / "photos", bad_file=False, empty_class=True)
    lines = check_configs([_write(tmp_path, folder_config(folder.root))])
    assert len(lines) == 3, lines
    assert lines[1].endswith(f" files[{folder.num_images} images read, 1 not used (listed)]")
    assert lines[2] == f"  data: {folder.empty}: empty class folder: no image file in it " + (
        "(left out of the classes)"
    )


def test_an_unreadable_image_is_an_error_naming_it_and_the_unused_files(tmp_path, capsys):
    folder = make_image_folder(tmp_path / "photos", bad_file=True, empty_class=True)
    path = _write(tmp_path, folder_config(folder.root))
    with pytest.raises(DataScanError) as info:
        check_configs([path])
    message = str(info.value)
    assert message.startswith("data: 1 image file(s) that training would load cannot be read")
    assert f"\n  {folder.broken}: cannot identify image file" in message
    assert str(folder.non_image) in message.split("not used (no error):")[1]
    assert str(folder.empty) in message.split("not used (no error):")[1]
    # the CLI: exit 2 with that message; --no-scan opens no file and lists the unused ones
    assert cli.main(["check", path]) == 2
    assert f"{folder.broken}: cannot identify image file" in capsys.readouterr().err
    assert cli.main(["check", path, "--no-scan"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].endswith(
        f" files[{folder.num_images + 1} images, not opened, 2 not used (listed)]"
    )
    assert sorted(out[2:]) == sorted(
        [
            f"  data: {folder.empty}: empty class folder: no image file in it (left out of the "
            "classes)",
            f"  data: {folder.non_image}: " + ImageFolderDataset(folder.root, True).ignored[0][1],
        ]
    )


def _landmarks(tmp_path) -> tuple:
    root = tmp_path / "landmarks"
    (root / "img").mkdir(parents=True)
    rows = []
    for i in range(6):
        Image.fromarray(np.full((4, 4, 3), 40 * i, np.uint8)).save(root / "img" / f"{i}.png")
        rows.append(f"img/{i}.png {i // 2}")
    (root / "img" / "text.jpg").write_text("not a jpeg")
    rows += ["img/text.jpg 3", "img/text.jpg.missing 3"]
    (root / "list.txt").write_text("\n".join(rows) + "\n")
    return root, LandmarksList(root, "list.txt")


def test_an_image_list_dataset_is_scanned_through_its_file_list(tmp_path):
    root, dataset = _landmarks(tmp_path)
    findings = data_scan.dataset_findings(dataset)
    assert findings == [
        (str(root / "img" / "text.jpg"), findings[0][1]),
        (str(root / "img" / "text.jpg.missing"), "image file not found"),
    ]
    assert findings[0][1].startswith("cannot identify image file")
    with pytest.raises(DataScanError, match=r"data: 2 image file\(s\)"):
        DataScan().report({"train": dataset})
    # without headers nothing is opened and nothing is found
    assert DataScan(headers=False).report({"train": dataset}) == ("8 images, not opened", [])


def test_each_dataset_is_scanned_once_and_in_memory_data_says_so(tmp_path, monkeypatch):
    folder = make_image_folder(tmp_path / "photos", bad_file=False, empty_class=False)
    dataset = ImageFolderDataset(folder.root, category_folders=True)
    calls = []
    findings = data_scan.dataset_findings

    def counted(dataset, headers=True):
        calls.append(dataset)
        return findings(dataset, headers)

    monkeypatch.setattr(data_scan, "dataset_findings", counted)
    scan = DataScan()
    want = (f"{folder.num_images} images read", [])
    assert scan.report({"train": dataset, "test": dataset}) == want
    again = ImageFolderDataset(folder.root, category_folders=True)  # another method's build
    assert scan.report([again]) == want
    assert calls == [dataset]
    from tests.tiny import TinyDataset

    assert scan.report({"train": TinyDataset()}) == ("in memory", [])


def test_a_large_set_shows_a_progress_bar_on_stderr(tmp_path, monkeypatch, capsys):
    root, dataset = _landmarks(tmp_path)
    monkeypatch.setattr(data_scan, "LARGE", 4)
    data_scan.dataset_findings(dataset)
    err = capsys.readouterr().err
    assert "check: reading LandmarksList image headers" in err and "/8 [" in err
    monkeypatch.setattr(data_scan, "LARGE", 9)
    data_scan.dataset_findings(dataset)
    assert capsys.readouterr().err == ""


def test_a_dataset_with_a_scan_method_is_used_whatever_its_class(tmp_path):
    class Scanned:
        labels = np.zeros((2, 2), np.int64)

        def __len__(self):
            return 2

        def scan(self, progress=None):
            return [("somewhere/x.bin", "broken")]

    with pytest.raises(DataScanError, match="somewhere/x.bin: broken"):
        DataScan().report([Scanned()])  # no image_path: every finding is an error
    assert DataScan(headers=False).report([Scanned()]) == ("2 images, not opened", [])
