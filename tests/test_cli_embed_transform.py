"""One eval transform everywhere (issue 50, item 2): a run trained on an image folder with
``transforms: {train, eval}`` embeds its own training images through ``pml-rank embed --images``
to the vectors its evaluation gives them (``embed --split``, ``load_run``), and to a hand
computation with torchvision's transforms; a dataset-level ``transform:``, which ``load_run`` /
``embed --images`` cannot see, is refused by ``check`` and ``train`` naming the key."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from pml_rank_plugins.cli import main
from pml_rank_plugins.experiment.schema import ConfigError
from pml_rank_plugins.running import embed, load_run, train
from tests.data.image_folder_fixture import make_image_folder
from tests.tiny import tiny_config

pytestmark = pytest.mark.xdist_group("embed_folder_run")

SIZE, CROP = 12, 8  # images 12 x 12 RGB; the model takes 3 x 8 x 8 (a transform is required)
MEAN, STD = [0.5, 0.4, 0.3], [0.25, 0.2, 0.3]
TRANSFORMS = {
    "train": [
        {"RandomResizedCrop": {"size": CROP, "scale": [0.5, 1.0]}},
        {"RandomHorizontalFlip": {}},
        {"ToTensor": {}},
    ],
    "eval": [
        {"Resize": {"size": 10}},
        {"CenterCrop": {"size": CROP}},
        {"ToTensor": {}},
        {"Normalize": {"mean": MEAN, "std": STD}},
    ],
}


def folder_config(root) -> dict:
    """The tiny config on an ImageFolderDataset (6 classes, 2 categories), 3 classes a split."""
    cfg = tiny_config()
    cfg["dataset"] = {"ImageFolderDataset": {"root": str(root), "category_folders": True}}
    cfg["split"] = {
        "class_disjoint_split": {"fractions": [0.5, 0.5], "seed": 0},
        "names": ["train", "test"],
    }
    cfg["transforms"] = TRANSFORMS
    cfg["models"] = {"trunk": {"TinyNet": {"in_features": 3 * CROP * CROP, "embedding_dim": 16}}}
    cfg["sampler"] = {"MPerClassSampler": {"m": 4, "length_before_new_iter": 12}}
    cfg["trainer"]["MetricLossOnly"].update(num_epochs=1, iterations_per_epoch=2)
    cfg["eval"].update(validation=["test"], test=["test"])
    return cfg


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("folder_run")
    # a user's folder as issue 50 tells it: string class names under category folders, an empty
    # class folder and a file that is no image (both not used; `check` names them)
    folder = make_image_folder(base / "photos", size=SIZE, bad_file=False, empty_class=True)
    folder.non_image = folder.root / next(iter(folder.images)) / "notes.txt"
    folder.non_image.write_text("not an image\n")
    train(folder_config(folder.root), base / "run")
    return folder, base / "run"


def test_check_of_the_runs_config_names_the_files_not_used(folder_run, tmp_path, capsys):
    folder, _ = folder_run
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(folder_config(folder.root)))
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].endswith(f" files[{folder.num_images} images read, 2 not used (listed)]")
    assert [line.split(": ")[1] for line in out[2:]] == [str(folder.empty), str(folder.non_image)]
    assert all(line.startswith("  data: ") for line in out[2:])


def _by_path(loaded, split: str) -> dict[str, np.ndarray]:
    """``{image path relative to the folder: the embedding the run's evaluation gives it}``."""
    emb, _ = embed(loaded, split)
    subset = loaded.datasets[split]
    paths = [subset.dataset.paths[i].as_posix() for i in subset.indices]
    return dict(zip(paths, emb, strict=True))


def _by_hand(loaded, file) -> np.ndarray:
    """transforms.eval written out with torchvision, the trunk, the tester's L2 normalization."""
    from torchvision import transforms as T

    steps = T.Compose([T.Resize(10), T.CenterCrop(CROP), T.ToTensor(), T.Normalize(MEAN, STD)])
    with Image.open(file) as image:
        x = steps(image.convert("RGB"))[None]
    with torch.no_grad():
        out = loaded.embedder(loaded.trunk(x))
    return torch.nn.functional.normalize(out, dim=1)[0].numpy()


def test_embed_images_gives_the_embeddings_of_the_runs_own_evaluation(folder_run, tmp_path):
    folder, run = folder_run
    out = tmp_path / "mine.npz"
    assert main(["embed", str(run), "--images", str(folder.root), "--out", str(out)]) == 0
    loaded = load_run(run)
    want = {**_by_path(loaded, "train"), **_by_path(loaded, "test")}
    with np.load(out, allow_pickle=False) as data:
        paths, got = list(data["paths"]), data["embeddings"]
    assert sorted(paths) == sorted(p for ps in folder.images.values() for p in ps)
    assert got.shape == (folder.num_images, 16)
    for path, vector in zip(paths, got):
        np.testing.assert_allclose(vector, want[path], rtol=0, atol=1e-6, err_msg=path)
    # and the same as the transform written out by hand, for a training and a test image
    for split in ("train", "test"):
        subset = loaded.datasets[split]
        rel = subset.dataset.paths[subset.indices[0]].as_posix()
        np.testing.assert_allclose(
            got[paths.index(rel)], _by_hand(loaded, folder.root / rel), rtol=0, atol=1e-5
        )


def test_embed_split_writes_the_same_vectors(folder_run, tmp_path, capsys):
    folder, run = folder_run
    out = tmp_path / "test.npz"
    assert main(["embed", str(run), "--split", "test", "--out", str(out)]) == 0
    capsys.readouterr()
    assert (
        main(["embed", str(run), "--images", str(folder.root), "--out", str(tmp_path / "i.npz")])
        == 0
    )
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["shape"] == [folder.num_images, 16]
    loaded = load_run(run)
    subset = loaded.datasets["test"]
    rels = [subset.dataset.paths[i].as_posix() for i in subset.indices]
    with np.load(out) as split, np.load(tmp_path / "i.npz") as images:
        row = {p: i for i, p in enumerate(images["paths"])}
        np.testing.assert_allclose(
            split["embeddings"], images["embeddings"][[row[p] for p in rels]], rtol=0, atol=1e-6
        )


def test_a_dataset_level_transform_is_refused_by_check_and_train(tmp_path, capsys):
    folder = make_image_folder(tmp_path / "photos", size=SIZE, bad_file=False, empty_class=False)
    cfg = folder_config(folder.root)
    del cfg["transforms"]
    cfg["dataset"]["ImageFolderDataset"]["transform"] = {"ToTensor": {}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "dataset.ImageFolderDataset.transform: a dataset's own transform" in err
    assert "transforms: {train: [...], eval: [...]}" in err
    with pytest.raises(ConfigError, match=r"dataset\.ImageFolderDataset\.transform"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()


def _omniglot_folder(root) -> list:
    """An Omniglot-layout folder of 10 x 10 dark-on-light PNGs: 2 alphabets x 2 characters x 4."""
    gen = np.random.default_rng(1)
    files = []
    for alphabet in ("Alpha", "Beta"):
        for char in ("character01", "character02"):
            folder = root / "images_background" / alphabet / char
            folder.mkdir(parents=True)
            for i in range(4):
                pixels = gen.integers(0, 256, (10, 10)).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
                files.append(folder / f"{i}.png")
    return files


def test_embed_images_applies_the_datasets_own_decoding_omniglot(tmp_path):
    """Without transforms, OmniglotDataset's built-in resize to image_size and inversion is the
    run's transform: ``embed --images`` applies it to the raw files (it fed 10 x 10 dark-on-light
    images to a model trained on 8 x 8 inverted ones before)."""
    _omniglot_folder(tmp_path / "omniglot")
    cfg = tiny_config()
    cfg["dataset"] = {"OmniglotDataset": {"path": str(tmp_path / "omniglot"), "image_size": 8}}
    cfg["split"] = {
        "class_disjoint_split": {"fractions": [0.5, 0.5], "seed": 0},
        "names": ["train", "test"],
    }
    cfg["sampler"] = {"MPerClassSampler": {"m": 4, "length_before_new_iter": 8}}
    cfg["trainer"]["MetricLossOnly"].update(batch_size=8, num_epochs=1, iterations_per_epoch=1)
    cfg["eval"].update(validation=["test"], test=["test"])
    train(cfg, tmp_path / "run")
    out = tmp_path / "e.npz"
    argv = ["embed", str(tmp_path / "run"), "--images", str(tmp_path / "omniglot"), "--out"]
    assert main([*argv, str(out)]) == 0
    loaded = load_run(tmp_path / "run")
    assert loaded.eval_transform.prepare is not None
    want = {}
    for split in ("train", "test"):
        emb, _ = embed(loaded, split)
        subset = loaded.datasets[split]
        want.update(zip((subset.dataset.paths[i] for i in subset.indices), emb, strict=True))
    with np.load(out) as data:
        assert len(data["paths"]) == 16
        for path, vector in zip(data["paths"], data["embeddings"]):
            np.testing.assert_allclose(vector, want[str(path)], rtol=0, atol=1e-6, err_msg=path)
