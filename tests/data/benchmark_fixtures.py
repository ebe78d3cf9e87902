"""Tiny dataset trees in each benchmark's published format, under the folder names the shipped
benchmark configs expect below ``--data-root`` (``CUB_200_2011``, ``cars196``, ...).

Images are small PNGs of *unequal* sizes (as real photos are), so a config whose transforms do not
end in a fixed size fails at collate; every class has 4 images so PML's ``MPerClassSampler``
(m = 4) and the MLRC folds work. The trees are just large enough for the configs' own batch
sizes (the samplers refuse a batch the data cannot fill): 132 training images per SOP / In-Shop
category (FastAP's M/2 = 128), 128 unlabeled and 2 x 128 labeled VehicleID images, 12 MLRC
train+val classes (9 per fold train part: 36 images >= batch 32).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
import torchvision

from tests.data.fixtures import write_image, write_lines
from tests.data.matwriter import Struct, write_mat

PER_CLASS = 4
WEIGHTS = "weights/resnet50_imagenet1k_v1.pth"  # what every benchmark config names


def _size(i: int) -> tuple[int, int]:
    return (20 + 4 * (i % 3), 16 + 5 * (i % 2))


def _image(path: Path, i: int) -> None:
    write_image(path, (37 * i) % 256, _size(i))


def write_cub(data_root: Path, classes=(*range(1, 13), *range(101, 113))) -> Path:
    """``CUB_200_2011``: images.txt, image_class_labels.txt, images/ (24 classes by default:
    1-12 are the MLRC train+val half, 101-112 the test half)."""
    root = data_root / "CUB_200_2011"
    images, labels, n = [], [], 0
    for c in classes:
        for j in range(PER_CLASS):
            n += 1
            rel = f"{c:03d}.Bird_{c}/Bird_{c}_{j}.jpg"
            images.append(f"{n} {rel}")
            labels.append(f"{n} {c}")
            _image(root / "images" / rel, n)
    write_lines(root / "images.txt", images)
    write_lines(root / "image_class_labels.txt", labels)
    return root


def write_cars196(data_root: Path, classes=(*range(1, 13), *range(99, 111))) -> Path:
    """``cars196``: cars_annos.mat (struct array ``annotations``) and car_ims/."""
    root = data_root / "cars196"
    records, n = [], 0
    for c in classes:
        for _ in range(PER_CLASS):
            n += 1
            rel = f"car_ims/{n:06d}.jpg"
            records.append(
                {
                    "relative_im_path": rel,
                    "bbox_x1": 1.0,
                    "bbox_y1": 1.0,
                    "bbox_x2": 10.0,
                    "bbox_y2": 10.0,
                    "class": float(c),
                    "test": np.uint8(c > 98),
                }
            )
            _image(root / rel, n)
    root.mkdir(parents=True, exist_ok=True)
    write_mat(root / "cars_annos.mat", {"annotations": Struct(records)}, compress=True)
    return root


_SOP_CATEGORIES = ("bicycle_final", "chair_final", "lamp_final")


def write_sop(data_root: Path, train_classes: int = 99, test_classes: int = 6) -> Path:
    """``Stanford_Online_Products``: Ebay_train.txt / Ebay_test.txt (header + rows), images in
    ``<category>_final/``; class k belongs to category k % 3."""
    root = data_root / "Stanford_Online_Products"
    header = "image_id class_id super_class_id path"
    n = 0
    for name, first, count in (("train", 1, train_classes), ("test", 11319, test_classes)):
        rows = [header]
        for k in range(count):
            cls, cat = first + k, k % len(_SOP_CATEGORIES)
            for j in range(PER_CLASS):
                n += 1
                rel = f"{_SOP_CATEGORIES[cat]}/{cls}_{j}.JPG"
                rows.append(f"{len(rows)} {cls} {cat + 1} {rel}")
                _image(root / rel, n)
        write_lines(root / f"Ebay_{name}.txt", rows)
    return root


_INSHOP_TYPES = ("MEN/Denim", "WOMEN/Dresses", "WOMEN/Blouses_Shirts")


def write_inshop(data_root: Path, train_items: int = 99, test_items: int = 6) -> Path:
    """``InShop``: list_eval_partition.txt (count, header, rows) and img/<GENDER>/<Type>/id_*/;
    test items put 2 images in query and 2 in gallery."""
    root = data_root / "InShop"
    rows, n = [], 0
    for item in range(1, train_items + test_items + 1):
        kind = _INSHOP_TYPES[item % len(_INSHOP_TYPES)]
        for j in range(PER_CLASS):
            n += 1
            status = "train" if item <= train_items else ("query" if j < 2 else "gallery")
            rel = f"img/{kind}/id_{item:08d}/{j:02d}_1_front.jpg"
            rows.append(f"{rel} id_{item:08d} {status}")
            _image(root / rel, n)
    header = "image_name item_id evaluation_status"
    write_lines(root / "list_eval_partition.txt", [str(len(rows)), header] + rows)
    return root


def write_vehicleid(data_root: Path) -> Path:
    """``VehicleID_V1.0``: train_test_split/{train_list,test_list_800,1600,2400}.txt,
    attribute/model_attr.txt (training vehicles 1-64 have model 1 or 2, 65-96 none), image/."""
    root = data_root / "VehicleID_V1.0"
    n, models = 0, []
    lists = {
        "train_list.txt": range(1, 97),
        "test_list_800.txt": range(100, 104),
        "test_list_1600.txt": range(100, 106),
        "test_list_2400.txt": range(100, 108),
    }
    for vehicle in range(1, 65):
        models.append(f"{vehicle} {1 + vehicle % 2}")
    for name, vehicles in lists.items():
        lines = []
        for v in vehicles:
            for j in range(PER_CLASS):
                image = f"{v:05d}{j:03d}"
                lines.append(f"{image} {v}")
                if not (root / "image" / f"{image}.jpg").exists():
                    n += 1
                    _image(root / "image" / f"{image}.jpg", n)
        write_lines(root / "train_test_split" / name, lines)
    write_lines(root / "attribute" / "model_attr.txt", models)
    return root


def write_revisited(data_root: Path, name: str = "roxford5k", num_db: int = 12) -> Path:
    """``revisitop/<name>/gnd_<name>.pkl`` (``imlist``, ``qimlist``, ``gnd`` with per-query
    ``bbx``, ``easy``, ``hard``, ``junk``) and ``revisitop/<name>/jpg/<image>.jpg``; 3 queries,
    the third with only junk positives."""
    root = data_root / "revisitop" / name
    imlist = [f"{name}_db_{i:03d}" for i in range(num_db)]
    qimlist = [f"{name}_q_{i}" for i in range(3)]
    gnd = [
        {"bbx": [2.0, 2.0, 14.0, 12.0], "easy": [0, 1], "hard": [2], "junk": [3]},
        {"bbx": [0.0, 0.0, 10.0, 10.0], "easy": [4], "hard": [5, 6], "junk": []},
        {"bbx": [1.0, 1.0, 9.0, 9.0], "easy": [], "hard": [], "junk": [7, 8]},
    ]
    for i, image in enumerate(imlist + qimlist):
        _image(root / "jpg" / f"{image}.jpg", i + 1)
    with open(root / f"gnd_{name}.pkl", "wb") as handle:
        pickle.dump({"imlist": imlist, "qimlist": qimlist, "gnd": gnd}, handle)
    return root


def write_landmarks(data_root: Path, classes: int = 6) -> Path:
    """``landmarks/train_list.txt`` (``path label`` lines) and the images it names."""
    root = data_root / "landmarks"
    lines, n = [], 0
    for c in range(classes):
        for j in range(PER_CLASS):
            n += 1
            rel = f"images/{c}/{j}.jpg"
            lines.append(f"{rel} {c}")
            _image(root / rel, n)
    write_lines(root / "train_list.txt", lines)
    return root


def write_resnet50_weights(data_root: Path) -> Path:
    """A torchvision ResNet-50 state dict (random weights) where the configs expect ImageNet's."""
    path = data_root / WEIGHTS
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(torchvision.models.resnet50(weights=None).state_dict(), path)
    return path


WRITERS = {
    "mlrc_cub200.yaml": (write_cub,),
    "mlrc_cars196.yaml": (write_cars196,),
    "mlrc_sop.yaml": (write_sop,),
    "fastap_sop.yaml": (write_sop,),
    "fastap_inshop.yaml": (write_inshop,),
    "fastap_vehicleid.yaml": (write_vehicleid,),
    "rll_sop.yaml": (write_sop,),
    "mapq_roxford.yaml": (
        write_landmarks,
        write_revisited,
        lambda root: write_revisited(root, "rparis6k"),
    ),
}


def write_all(data_root: Path) -> Path:
    """Every tree above plus the weights file, under one data root."""
    for writer in {w for writers in WRITERS.values() for w in writers}:
        writer(data_root)
    write_resnet50_weights(data_root)
    return data_root
