"""Where data and weights files live: ``data_root`` (``--data-root DIR`` / ``PML_RANK_DATA``).

A config's file paths (dataset ``root`` / ``path`` / ``list_file`` / ``category_file`` keywords and model
``weights_path`` keywords) may be relative. They are resolved against the config's top-level
``data_root`` when it is set (the CLI fills it from ``--data-root`` or, failing that, from the
``PML_RANK_DATA`` environment variable), otherwise against the current directory. Absolute paths
are kept. The resolved root is saved in the run's ``config.yaml`` so ``pml-rank eval RUN_DIR``
finds the same files.

A dataset folder that does not exist is a :class:`~pml_rank_plugins.experiment.schema.ConfigError`
naming the key, the folder it looked for, and where the published archive comes from
(:data:`PUBLISHED`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..data.images import ImageListDataset
from . import registry
from .schema import ConfigError, is_object_spec, spec_name_and_kwargs

ENV_VAR = "PML_RANK_DATA"
PATH_KEYWORDS = ("root", "path", "list_file", "category_file")
WEIGHTS_KEYWORDS = ("weights_path",)

# Dataset class -> (folder under the data root that the shipped configs use, what it must hold,
# published archive). The documented layout: DATA_ROOT/<folder>/<what it holds>, e.g.
# DATA_ROOT/omniglot/images_background_small1.zip or DATA_ROOT/CUB_200_2011/images.txt.
PUBLISHED: dict[str, tuple[str, str, str]] = {
    "CUB200": (
        "CUB_200_2011",
        "images.txt, image_class_labels.txt, images/",
        "CUB_200_2011.tgz from https://www.vision.caltech.edu/datasets/cub_200_2011/",
    ),
    "Cars196": (
        "cars196",
        "cars_annos.mat, car_ims/",
        "car_ims.tgz and cars_annos.mat from "
        "https://ai.stanford.edu/~jkrause/cars/car_dataset.html",
    ),
    "StanfordOnlineProducts": (
        "Stanford_Online_Products",
        "Ebay_train.txt, Ebay_test.txt, <category>_final/",
        "Stanford_Online_Products.zip from https://cvgl.stanford.edu/projects/lifted_struct/",
    ),
    "InShopClothes": (
        "InShop",
        "list_eval_partition.txt (or Eval/), img/ (or Img/img/)",
        "In-shop Clothes Retrieval Benchmark (img.zip, list_eval_partition.txt) from "
        "https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion/InShopRetrieval.html",
    ),
    "VehicleID": (
        "VehicleID_V1.0",
        "train_test_split/, image/, attribute/model_attr.txt",
        "PKU VehicleID (VehicleID_V1.0) from https://www.pkuml.org/resources/pku-vehicleid.html",
    ),
    "RevisitedOxfordParis": (
        "revisitop",
        "roxford5k/gnd_roxford5k.pkl + roxford5k/jpg/, rparis6k/gnd_rparis6k.pkl + rparis6k/jpg/",
        "gnd_roxford5k.pkl / gnd_rparis6k.pkl from http://cmp.felk.cvut.cz/revisitop/ and the "
        "Oxford / Paris Buildings images (oxbuild_images-v1.tgz, paris_1-v1.tgz, paris_2-v1.tgz)",
    ),
    "LandmarksList": (
        "landmarks",
        "a list file of 'path label [category]' lines and the images it names",
        "a landmarks training list, e.g. Landmarks-clean (Gordo et al.), as used by the "
        "listwise-AP paper",
    ),
    "OmniglotDataset": (
        "omniglot",
        "images_background_small1.zip (the shipped configs' file; any images_background*.zip"
        " works via --set dataset.OmniglotDataset.path=...)",
        "https://github.com/brendenlake/omniglot (python/images_background_small1.zip)",
    ),
}


def default_data_root() -> str | None:
    """``$PML_RANK_DATA`` if set and non-empty, else None."""
    return os.environ.get(ENV_VAR) or None


def resolve_path(value: Any, data_root: str | Path | None) -> Any:
    """A relative path string joined to ``data_root`` (unchanged if absolute, not a string, or
    no root)."""
    if not isinstance(value, (str, Path)) or data_root is None:
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else Path(data_root).expanduser() / path)


def _root_text(data_root) -> str:
    if data_root is None:
        return f"no data root set (--data-root DIR or ${ENV_VAR}); relative to {os.getcwd()}"
    return f"data root {data_root}"


def resolve_dataset_spec(spec: Any, where: str, data_root: str | None) -> Any:
    """Copy of a dataset spec with its path keywords resolved against ``data_root``; a missing
    folder or list file raises :class:`ConfigError` naming ``where``, the folder and the archive.
    """
    if spec is None:
        return spec
    name, kwargs = spec_name_and_kwargs(spec, where)
    kwargs = dict(kwargs)
    short = name.split(":")[-1].split(".")[-1]
    for key in PATH_KEYWORDS:
        if key not in kwargs or kwargs[key] is None:
            continue
        resolved = resolve_path(kwargs[key], data_root)
        kwargs[key] = resolved
        if _is_file_dataset(name, short) and not Path(resolved).exists():
            hint = _missing_hint(short, key, spec_name_and_kwargs(spec, where)[1][key], data_root)
            raise ConfigError(
                f"{where}.{name}.{key}: {resolved} not found ({_root_text(data_root)}).{hint}"
            )
    return {name: kwargs}


# Readers of the user's own files (a list in the published format, not one published data set):
# the archive of PUBLISHED is advice only when the config uses the shipped layout.
OWN_FILES = ("LandmarksList",)


def _missing_hint(short: str, key: str, written: Any, data_root) -> str:
    """The advice after a missing dataset path: the published archive of a benchmark reader (for
    ``OWN_FILES`` readers only when ``written``, the path as the config wrote it, is the shipped
    layout ``<folder>/...``), else how a path of one's own data is resolved."""
    written = Path(str(written)).expanduser()
    if short in PUBLISHED:
        folder, content, archive = PUBLISHED[short]
        shipped = not written.is_absolute() and written.parts[:1] == (folder,)
        if short not in OWN_FILES or shipped:
            return (
                f" Pass --data-root DIR (or set ${ENV_VAR}=DIR) where DIR/{folder}/ holds "
                f"the {short} files ({content}); get them from {archive}."
            )
    start = f"the data root {data_root}" if data_root is not None else "the current folder"
    return (
        f" A {key} is an absolute path, or relative to the data root (--data-root DIR or "
        f"${ENV_VAR}; here {start}), not to the config file's folder: write it absolute, or "
        "relative to that root."
    )


def _is_file_dataset(name: str, short: str) -> bool:
    """Datasets read from files (not a cache folder they create, like GlyphDataset's)."""
    if short in PUBLISHED:
        return True
    try:
        cls = registry.resolve(name)
    except Exception:  # an unknown name is reported by the builder, with suggestions
        return False
    return isinstance(cls, type) and issubclass(cls, ImageListDataset)


def resolve_data_root(flag: str | None) -> str | None:
    """The data root for ``--data-root DIR`` (else ``$PML_RANK_DATA``), as an absolute path, or
    None when neither is given. The value is set as the configs' ``data_root`` (a ``--set
    data_root=...`` still wins)."""
    root = flag or default_data_root()
    if not root:
        return None
    return str(Path(root).expanduser().resolve())


def resolve_weights(value: Any, data_root: str | None) -> Any:
    """Resolve every ``weights_path`` inside a (possibly nested) model spec."""
    if is_object_spec(value):
        name, kwargs = next(iter(value.items()))
        return {name: resolve_weights(kwargs or {}, data_root)}
    if isinstance(value, dict):
        return {
            k: (
                resolve_path(v, data_root)
                if k in WEIGHTS_KEYWORDS
                else resolve_weights(v, data_root)
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [resolve_weights(v, data_root) for v in value]
    return value
