"""ImageFolderDataset: a generated folder of class sub-folders (string names, categories as parent
folders or a CSV, a non-image file, a broken .png, an empty class folder). Expected values come
from the generator (``tests/data/image_folder_fixture.py``), never from the dataset."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from pml_rank_plugins.data import (
    DatasetFormatError,
    ImageFolderDataset,
    LabeledSubset,
    label_names,
)
from pml_rank_plugins.experiment.datasets import build_splits
from pml_rank_plugins.experiment.schema import ConfigError
from pml_rank_plugins.samplers import CategoryHardSampler
from tests.data.image_folder_fixture import DEFAULT_CLASSES, make_image_folder


@pytest.fixture
def folder(tmp_path):
    return make_image_folder(tmp_path / "photos")


def expected_items(gen, with_broken=True):
    """``{path relative to root: (class name, category name)}`` as the generator wrote them."""
    out = {p: (rel, gen.classes[rel]) for rel, paths in gen.images.items() for p in paths}
    if with_broken and gen.broken is not None:
        rel = gen.broken.parent.relative_to(gen.root).as_posix()
        out[gen.broken.relative_to(gen.root).as_posix()] = (rel, gen.classes[rel])
    return out


def test_class_folders_under_category_folders_give_sorted_ids_and_names(folder):
    ds = ImageFolderDataset(folder.root, category_folders=True)
    want_classes = sorted(folder.classes)  # "animals/Zebra" < "animals/ant": code-point order
    assert ds.class_names == want_classes
    assert ds.class_names[:2] == ["animals/Zebra", "animals/ant"]
    assert ds.category_names == sorted(DEFAULT_CLASSES) == ["animals", "fruit"]
    items = expected_items(folder)  # broken.png has an image suffix: an item until scanned
    assert ds.labels.shape == (len(items), 2) and ds.labels.dtype == np.int64
    assert len(ds) == folder.num_images + 1
    got = {
        p.as_posix(): (ds.class_names[c], ds.category_names[k])
        for p, (c, k) in zip(ds.paths, ds.labels.tolist(), strict=True)
    }
    assert got == items
    # items are ordered by class id, then file name
    assert ds.labels[:, 0].tolist() == sorted(ds.labels[:, 0].tolist())
    assert ds.paths[0].as_posix() == "animals/Zebra/Zebra_0.png"


def test_ids_do_not_depend_on_the_order_folders_were_written(tmp_path):
    reversed_classes = {c: names[::-1] for c, names in reversed(DEFAULT_CLASSES.items())}
    # bad_file=False: the generator puts its bad files into the first folders it writes
    a_gen = make_image_folder(tmp_path / "a", bad_file=False)
    a = ImageFolderDataset(a_gen.root, category_folders=True)
    b_gen = make_image_folder(tmp_path / "b", classes=reversed_classes, bad_file=False)
    b = ImageFolderDataset(b_gen.root, category_folders=True)
    assert a.class_names == b.class_names and a.category_names == b.category_names
    assert [p.as_posix() for p in a.paths] == [p.as_posix() for p in b.paths]
    np.testing.assert_array_equal(a.labels, b.labels)


def test_an_item_is_the_image_and_its_two_level_label(folder):
    ds = ImageFolderDataset(folder.root, category_folders=True)
    image, label = ds[5]
    file = folder.root / ds.paths[5]
    want = torch.from_numpy(np.array(Image.open(file).convert("RGB"))).permute(2, 0, 1) / 255.0
    assert image.shape == (3, folder.size, folder.size)
    torch.testing.assert_close(image, want.float())
    assert label.dtype == torch.int64 and label.tolist() == ds.labels[5].tolist()
    gray = ImageFolderDataset(folder.root, category_folders=True, mode="L")
    assert gray[5][0].shape == (1, folder.size, folder.size)


def test_scan_names_the_empty_class_the_non_image_and_the_broken_file(folder):
    ds = ImageFolderDataset(folder.root, category_folders=True)
    assert ds.empty_classes == [folder.empty]
    calls = []
    problems = ds.scan(progress=lambda done, total: calls.append((done, total)))
    assert [p for p, _ in problems] == [
        str(folder.empty),
        str(folder.non_image),
        str(folder.broken),
    ]
    reasons = dict(problems)
    assert "empty class folder" in reasons[str(folder.empty)]
    assert (
        "not an image file" in reasons[str(folder.non_image)]
        and ".txt" in reasons[str(folder.non_image)]
    )
    assert "cannot identify image file" in reasons[str(folder.broken)]
    assert calls[-1] == (len(ds), len(ds)) and len(calls) == len(ds)
    # headers=False: only what building found (no image opened)
    assert ds.scan(headers=False) == problems[:2]


def test_a_clean_folder_scans_clean(tmp_path):
    gen = make_image_folder(tmp_path / "clean", bad_file=False, empty_class=False)
    ds = ImageFolderDataset(gen.root, category_folders=True)
    assert ds.scan() == [] and ds.empty_classes == [] and len(ds) == gen.num_images


def test_flat_folders_without_categories_have_category_minus_one(tmp_path):
    gen = make_image_folder(tmp_path / "flat", categories=False)
    ds = ImageFolderDataset(gen.root)
    names = [n for ns in DEFAULT_CLASSES.values() for n in ns]
    assert ds.class_names == sorted(names) and ds.category_names == []
    assert set(ds.labels[:, 1].tolist()) == {-1}
    assert len(ds) == gen.num_images + 1


def test_a_mapping_file_gives_the_categories(tmp_path):
    gen = make_image_folder(tmp_path / "flat", categories=False, mapping_file="map.csv")
    ds = ImageFolderDataset(gen.root, category_file=gen.mapping)
    assert ds.category_names == ["animals", "fruit"]
    for path, (c, k) in zip(ds.paths, ds.labels.tolist(), strict=True):
        name = path.parent.as_posix()
        assert ds.class_names[c] == name
        assert ds.category_names[k] == gen.classes[name]


@pytest.mark.parametrize(
    "text, message",
    [
        ("apple,fruit\n", "line 1: expected the header 'class,category'"),
        ("class,category\napple,fruit\n", r"no category for 5 class folder\(s\)"),
        ("class,category\napple,fruit\napple,veg\n", "line 3: class 'apple' is already listed"),
        ("class,category\napple\n", "line 2: expected 'class,category'"),
        ("", "line 1: expected the header"),
    ],
)
def test_a_bad_mapping_file_is_refused_naming_it(tmp_path, text, message):
    gen = make_image_folder(tmp_path / "flat", categories=False)
    mapping = tmp_path / "map.csv"
    mapping.write_text(text, encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=message) as err:
        ImageFolderDataset(gen.root, category_file=mapping)
    assert str(mapping) in str(err.value)


def test_a_mapping_with_extra_rows_and_quoted_commas_is_read(tmp_path):
    gen = make_image_folder(
        tmp_path / "flat", classes={"x": ["a, b", "c"]}, categories=False, bad_file=False
    )
    mapping = tmp_path / "map.csv"
    mapping.write_text('class,category\n"a, b",one\nc,two\nnot there,three\n', encoding="utf-8")
    ds = ImageFolderDataset(gen.root, category_file=mapping)
    assert ds.class_names == ["a, b", "c"] and ds.category_names == ["one", "two"]


def test_layout_mistakes_are_refused_or_reported_by_path(tmp_path, folder):
    with pytest.raises(DatasetFormatError, match="category_folders=True") as err:
        ImageFolderDataset(folder.root)  # category folders read as classes: no image directly
    assert str(folder.root) in str(err.value)
    with pytest.raises(DatasetFormatError, match="image folder not found") as err:
        ImageFolderDataset(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(err.value)
    with pytest.raises(ValueError, match="not both"):
        ImageFolderDataset(folder.root, category_folders=True, category_file="x.csv")
    flat = make_image_folder(tmp_path / "flat", categories=False, bad_file=False)
    (flat.root / "apple" / "more").mkdir()
    (flat.root / "readme.md").write_text("hi")
    (flat.root / "apple" / ".DS_Store").write_bytes(b"\0")
    ds = ImageFolderDataset(flat.root)
    reasons = dict((str(p), why) for p, why in ds.ignored)
    assert set(reasons) == {str(flat.root / "apple" / "more"), str(flat.root / "readme.md")}
    assert "folder inside a class folder" in reasons[str(flat.root / "apple" / "more")]
    assert "category_folders" in reasons[str(flat.root / "apple" / "more")]
    assert "outside the class folders" in reasons[str(flat.root / "readme.md")]
    # under category folders: a category without classes, a file beside the class folders
    (folder.root / "plants").mkdir()
    (folder.root / "fruit" / "list.txt").write_text("x")
    (folder.root / "fruit" / "apple" / "old").mkdir()
    nested = ImageFolderDataset(folder.root, category_folders=True)
    reasons = dict((str(p), why) for p, why in nested.ignored)
    assert "category folder without class folders" in reasons[str(folder.root / "plants")]
    assert (
        "in a category folder, outside the class folders"
        in reasons[str(folder.root / "fruit" / "list.txt")]
    )
    inside = reasons[str(folder.root / "fruit" / "apple" / "old")]
    assert "folder inside a class folder" in inside and "category_folders" not in inside


def test_category_hard_batches_come_from_the_category_folders(tmp_path):
    gen = make_image_folder(
        tmp_path / "f", images_per_class=2, size=4, bad_file=False, empty_class=False
    )
    ds = ImageFolderDataset(gen.root, category_folders=True)
    sampler = CategoryHardSampler(
        ds.labels, batch_size=4, batches_per_pair=1, categories_per_batch=2, samples_per_class=2
    )
    for batch in sampler.epoch_batches(0):
        assert len(batch) == 4
        # 4 images = 2 classes, one per category (2 categories per batch)
        assert len(set(ds.labels[batch, 1].tolist())) == 2


def test_label_names_reach_through_subsets(folder):
    ds = ImageFolderDataset(folder.root, category_folders=True)
    sub = torch.utils.data.Subset(LabeledSubset(LabeledSubset(ds, [0, 1, 2]), [1, 2]), [0])
    assert label_names(sub) == (ds.class_names, ds.category_names)
    assert label_names(torch.utils.data.TensorDataset(torch.zeros(2))) == (None, None)


def test_a_config_names_it_with_paths_under_the_data_root(tmp_path):
    gen = make_image_folder(tmp_path / "data" / "photos", bad_file=False)
    config = {
        "data_root": str(tmp_path / "data"),
        "dataset": {"ImageFolderDataset": {"root": "photos", "category_folders": True}},
        "split": {"class_disjoint_split": {"fractions": [0.5, 0.5], "seed": 0}},
    }
    splits = build_splits(config, seed=0)
    classes = set()
    for part in splits.values():
        names, _ = label_names(part)
        classes |= {names[c] for c in part.labels[:, 0].tolist()}
    assert classes == set(gen.classes)
    shutil.rmtree(gen.root)
    with pytest.raises(ConfigError, match=r"dataset\.ImageFolderDataset\.root: .*photos not found"):
        build_splits(config, seed=0)


def test_a_config_resolves_the_category_file_under_the_data_root(tmp_path):
    gen = make_image_folder(
        tmp_path / "data" / "photos", categories=False, mapping_file="map.csv", bad_file=False
    )
    spec = {"ImageFolderDataset": {"root": "photos", "category_file": "map.csv"}}
    config = {"data_root": str(tmp_path / "data"), "dataset": spec}
    ds = build_splits(config, seed=0)["train"]
    assert ds.category_names == ["animals", "fruit"] and gen.mapping == tmp_path / "data/map.csv"
    spec["ImageFolderDataset"]["category_file"] = "missing.csv"
    with pytest.raises(ConfigError, match=r"category_file: .*missing\.csv not found"):
        build_splits(config, seed=0)
