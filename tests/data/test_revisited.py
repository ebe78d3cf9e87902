"""RevisitedOxfordParis on fixture trees in the published layout (gnd_<name>.pkl + jpg/)."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
import torch

from pml_rank_plugins.data import DatasetFormatError, RevisitedOxfordParis
from pml_rank_plugins.data.revisited import load_ground_truth
from pml_rank_plugins.functional.revisited import revisited_evaluate

from .fixtures import write_jpeg

IMLIST = ["all_souls_000000", "ashmolean_000001", "radcliffe_000002", "christ_church_000003"]
QIMLIST = ["all_souls_000013", "radcliffe_000031"]


def ground_truth():
    return {
        "imlist": list(IMLIST),
        "qimlist": list(QIMLIST),
        "gnd": [
            {"bbx": [12.4, 2.0, 20.0, 10.0], "easy": [0], "hard": [3], "junk": [1]},
            {"bbx": np.array([0.0, 0.0, 8.0, 6.0]), "easy": [], "hard": [2], "junk": []},
        ],
    }


def half_image(left: int, right: int, size=(24, 16)) -> np.ndarray:
    pixels = np.full((size[1], size[0], 3), left, np.uint8)
    pixels[:, size[0] // 2 :] = right
    return pixels


def make_tree(root, name="roxford5k", truth=None, images=True):
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"gnd_{name}.pkl", "wb") as handle:
        pickle.dump(ground_truth() if truth is None else truth, handle)
    if images:
        for i, image in enumerate(IMLIST):
            write_jpeg(folder / "jpg" / f"{image}.jpg", np.full((12, 10, 3), 20 * (i + 1)))
        for image in QIMLIST:
            write_jpeg(folder / "jpg" / f"{image}.jpg", half_image(0, 200))
    return root


@pytest.mark.parametrize("name", ["roxford5k", "rparis6k"])
def test_query_and_database_splits(tmp_path, name):
    root = make_tree(tmp_path, name)
    queries = RevisitedOxfordParis(root, name, "query")
    assert len(queries) == 2 and queries.labels.tolist() == [[0, -1], [1, -1]]
    image, label = queries[0]
    # box [12.4, 2, 20, 10] -> PIL crop (12, 2, 20, 10): 8 x 8 from the bright right half
    assert image.shape == (3, 8, 8) and label.tolist() == [0, -1]
    assert image.min() > 0.7
    assert queries[1][0].shape == (3, 6, 8) and queries[1][0].max() < 0.1  # dark left corner
    database = RevisitedOxfordParis(root, name, "database")
    assert database.labels.tolist() == [[-1, -1], [-2, -1], [-3, -1], [-4, -1]]
    image, _ = database[2]
    assert image.shape == (3, 12, 10) and abs(image.mean().item() - 60 / 255) < 0.02
    assert database.boxes is None and queries.boxes.shape == (2, 4)
    for ds in (queries, database):
        assert ds.imlist == IMLIST and ds.qimlist == QIMLIST
        assert ds.gnd[0]["hard"].tolist() == [3] and ds.gnd[1]["easy"].tolist() == []
        assert ds.gnd[0]["bbx"] == (12.4, 2.0, 20.0, 10.0)
    # no class is shared: PML's k-NN metrics cannot pair items by these labels
    classes = np.concatenate([queries.labels[:, 0], database.labels[:, 0]])
    assert len(np.unique(classes)) == len(classes)


def test_transform_gets_the_cropped_image_and_gnd_feeds_the_metric(tmp_path):
    root = make_tree(tmp_path)
    queries = RevisitedOxfordParis(root, transform=lambda img: img.size)
    assert queries[0][0] == (8, 8)
    database = RevisitedOxfordParis(root, split="database")
    embed = torch.eye(4, dtype=torch.float64)  # database image i -> e_i
    query_embeddings = torch.stack([embed[0] + 0.5 * embed[3], embed[2]])
    metrics = revisited_evaluate(query_embeddings, embed, database.gnd)
    assert metrics["map_medium"] == 1.0 and metrics["num_skipped_easy"] == 1


def drop(key):
    truth = ground_truth()
    del truth[key]
    return truth


def with_query(**changes):
    truth = ground_truth()
    truth["gnd"][1] = {**truth["gnd"][1], **changes}
    return truth


def without(key):
    truth = ground_truth()
    del truth["gnd"][0][key]
    return truth


@pytest.mark.parametrize(
    "truth,match",
    [
        (drop("gnd"), r"gnd_roxford5k.pkl: missing key 'gnd'"),
        (drop("imlist"), r"missing key 'imlist'"),
        (without("junk"), r"gnd\[0\] has no key 'junk'"),
        (without("bbx"), r"gnd\[0\] has no key 'bbx'"),
        (with_query(hard=[4]), r"gnd\[1\]\['hard'\] has index 4, outside 'imlist' \(0..3\)"),
        (with_query(junk=[-1]), r"gnd\[1\]\['junk'\] has index -1"),
        (with_query(junk=[2]), r"gnd\[1\]: index 2 is in both 'hard' and 'junk'"),
        (with_query(easy=[1, 1]), r"gnd\[1\]\['easy'\] lists an index twice"),
        (with_query(bbx=[5, 0, 2, 4]), r"gnd\[1\]\['bbx'\] must be \[x1, y1, x2, y2\]"),
        (with_query(bbx=[0, 0, 2]), r"gnd\[1\]\['bbx'\]"),
        (
            {**ground_truth(), "gnd": ground_truth()["gnd"][:1]},
            "'gnd' has 1 entries but 'qimlist' 2",
        ),
        ({**ground_truth(), "imlist": IMLIST + IMLIST[:1]}, r"imlist\[4\] repeats imlist\[0\]"),
        ({**ground_truth(), "qimlist": []}, "'qimlist' is empty"),
        ([1, 2], "expected a dict, got list"),
    ],
)
def test_bad_ground_truth(tmp_path, truth, match):
    make_tree(tmp_path, truth=truth, images=False)
    with pytest.raises(DatasetFormatError, match=match) as info:
        RevisitedOxfordParis(tmp_path, "roxford5k", "query")
    assert "gnd_roxford5k.pkl" in str(info.value)


def test_missing_files(tmp_path):
    with pytest.raises(DatasetFormatError, match=r"roxford5k/gnd_roxford5k.pkl: ground-truth file"):
        RevisitedOxfordParis(tmp_path)
    make_tree(tmp_path)
    (tmp_path / "roxford5k" / "jpg" / f"{IMLIST[2]}.jpg").unlink()
    RevisitedOxfordParis(tmp_path, split="query")  # the queries are all there
    with pytest.raises(
        DatasetFormatError, match=rf"{IMLIST[2]}.jpg: image file not found \(imlist\[2\] of .*pkl"
    ):
        RevisitedOxfordParis(tmp_path, split="database")
    with pytest.raises(ValueError, match="name must be one of"):
        RevisitedOxfordParis(tmp_path, name="oxford5k")
    with pytest.raises(ValueError, match="split must be one of"):
        RevisitedOxfordParis(tmp_path, split="db")


def test_corrupt_pickle_and_unsafe_pickle(tmp_path):
    folder = tmp_path / "rparis6k"
    folder.mkdir()
    (folder / "gnd_rparis6k.pkl").write_bytes(b"\x80\x04garbage")
    with pytest.raises(DatasetFormatError, match="gnd_rparis6k.pkl: not a readable ground-truth"):
        RevisitedOxfordParis(tmp_path, "rparis6k")

    class Payload:
        def __reduce__(self):
            return (print, ("never runs",))

    (folder / "gnd_rparis6k.pkl").write_bytes(pickle.dumps({"imlist": Payload()}))
    with pytest.raises(DatasetFormatError, match="refusing to load builtins.print"):
        RevisitedOxfordParis(tmp_path, "rparis6k")


def test_box_outside_the_image(tmp_path):
    root = make_tree(tmp_path, truth=with_query(bbx=[0, 0, 30, 6]))
    queries = RevisitedOxfordParis(root)
    with pytest.raises(
        DatasetFormatError, match=r"radcliffe_000031.jpg: gnd\[1\]\['bbx'\].*24 x 16"
    ):
        queries[1]


def test_corrupt_query_image_names_the_file(tmp_path):
    root = make_tree(tmp_path)
    path = root / "roxford5k" / "jpg" / f"{QIMLIST[0]}.jpg"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DatasetFormatError, match=re.escape(str(path))):
        RevisitedOxfordParis(root)[0]


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_ground_truth_with_numpy_arrays_loads_under_every_pickle_protocol(tmp_path, protocol):
    truth = ground_truth()
    truth["gnd"] = [
        {k: np.asarray(v, dtype=np.float64 if k == "bbx" else np.int64) for k, v in q.items()}
        for q in truth["gnd"]
    ]
    truth["gnd"][0]["bbx"] = truth["gnd"][0]["bbx"].astype(np.float32)
    make_tree(tmp_path, images=False)
    path = tmp_path / "roxford5k" / "gnd_roxford5k.pkl"
    path.write_bytes(pickle.dumps(truth, protocol=protocol))
    gnd = load_ground_truth(path)["gnd"]
    assert gnd[0]["junk"].tolist() == [1] and gnd[1]["hard"].tolist() == [2]
    assert gnd[1]["bbx"] == (0.0, 0.0, 8.0, 6.0)
