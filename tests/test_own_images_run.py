"""A run trained on an :class:`ImageFolderDataset` (issue 50, item 1): ``pml-rank embed``'s
``.npz`` carries the class names of the folders (``--split`` and ``--images``), the retrieval
record names the classes, and ``pml-rank list`` shows the dataset."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pml_rank_plugins.cli import main
from pml_rank_plugins.reporting.retrieval import write_retrieval_pictures
from pml_rank_plugins.running import train
from tests.data.image_folder_fixture import make_image_folder
from tests.tiny import tiny_config

CLASSES = {"birds": ["owl", "Emu", "kiwi", "tit"], "cats": ["lynx", "Puma", "lion", "ocelot"]}


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    """A one-epoch run on a generated 8-class folder (8 x 8 grayscale: TinyNet's input)."""
    base = tmp_path_factory.mktemp("folder_run")
    gen = make_image_folder(
        base / "photos", CLASSES, images_per_class=4, size=8, bad_file=False, empty_class=False
    )
    config = tiny_config(trainer={"MetricLossOnly": {"num_epochs": 1, "iterations_per_epoch": 2}})
    config["dataset"] = {
        "ImageFolderDataset": {"root": str(gen.root), "category_folders": True, "mode": "L"}
    }
    config["sampler"] = {"MPerClassSampler": {"m": 3, "length_before_new_iter": 24}}
    train(config, base / "run")
    return gen, base / "run"


def test_embed_split_writes_the_class_and_category_names(folder_run, tmp_path, capsys):
    gen, run = folder_run
    out = tmp_path / "test.npz"
    assert main(["embed", str(run), "--split", "test", "--out", str(out)]) == 0
    capsys.readouterr()
    with np.load(out, allow_pickle=False) as data:
        names, categories = list(data["class_names"]), list(data["category_names"])
        labels = data["labels"]
    assert names == sorted(gen.classes) and categories == sorted(CLASSES)
    assert labels.shape[1] == 2 and len(labels) > 0
    for class_id, category_id in labels.tolist():  # each name's category is its parent folder
        assert gen.classes[names[class_id]] == categories[category_id]


def test_embed_images_of_a_class_folder_writes_labels_and_class_names(folder_run, tmp_path, capsys):
    gen, run = folder_run
    out = tmp_path / "mine.npz"
    assert main(["embed", str(run), "--images", str(gen.root), "--out", str(out)]) == 0
    capsys.readouterr()
    with np.load(out, allow_pickle=False) as data:
        paths, labels, names = list(data["paths"]), data["labels"], list(data["class_names"])
    assert names == sorted(gen.classes)  # the run's own ids: the same folder, the same names
    assert len(paths) == gen.num_images == len(labels)
    for path, label in zip(paths, labels.tolist(), strict=True):
        assert path in gen.images[names[label]]
    # images directly in the folder: no class, so neither labels nor names
    flat = tmp_path / "loose"
    flat.mkdir()
    for name in ("a.png", "b.png"):
        (flat / name).write_bytes((gen.root / gen.images["birds/owl"][0]).read_bytes())
    assert main(["embed", str(run), "--images", str(flat), "--out", str(tmp_path / "f.npz")]) == 0
    capsys.readouterr()
    with np.load(tmp_path / "f.npz", allow_pickle=False) as data:
        assert "labels" not in data.files and "class_names" not in data.files


def test_list_shows_the_image_folder_dataset(capsys):
    assert main(["list", "--kind", "datasets", "ImageFolder"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "datasets:"
    assert out[1].split() == [
        "ImageFolderDataset",
        "pml_rank_plugins.data.image_folder.ImageFolderDataset",
    ]


def test_the_retrieval_record_names_the_classes(folder_run, tmp_path):
    gen, run = folder_run
    paths = write_retrieval_pictures(run, tmp_path, num_queries=2, k=2, pdf=False)
    record = json.loads(paths[-1].read_text())
    names = sorted(gen.classes)
    for entry in record["queries"] + record["worst"]:
        assert entry["class_name"] == names[entry["label"]]
        assert entry["retrieved_class_names"] == [names[c] for c in entry["retrieved_labels"]]


def test_the_shipped_own_images_config_checks_on_a_generated_folder(tmp_path, capsys):
    # DATA_ROOT/images/<class>/<image>, RGB of another size than the transforms' 32 x 32
    classes = {"x": [f"class {i}" for i in range(8)]}
    make_image_folder(
        tmp_path / "images", classes, size=40, categories=False, bad_file=False, empty_class=False
    )
    argv = ["check", "own_images", "--data-root", str(tmp_path), "--methods", "plugin FastAP"]
    assert main([*argv, "--set", "trainer.MetricLossOnly.batch_size=8"]) == 0, capsys.readouterr()
    assert "plugin FastAP" in capsys.readouterr().out
    # the default batch of 64 does not fit 4 training classes x 4 images: refused, naming it
    assert main(argv) == 2
    assert "cannot fill a batch of 64" in capsys.readouterr().err
