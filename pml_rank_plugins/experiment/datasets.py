"""Datasets of one experiment: ``{split name: dataset}`` from the config's data sections.

Three forms: one ``dataset`` cut by a ``split:`` function (class-disjoint splits of
:mod:`pml_rank_plugins.data.splits`, an optional item-level query/gallery split), ``datasets:``
taking each split from a reader's published split, or fold ``split.fold`` of the MLRC protocol
(:mod:`.mlrc`). Paths are resolved against ``data_root`` (:mod:`.data_root`); ``transforms.train``
feeds the ``train`` split, ``transforms.eval`` the others (:mod:`.transforms`).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from ..data.splits import LabeledSubset, class_disjoint_kfold, mlrc_protocol, query_gallery_split
from . import mlrc, registry
from .data_root import resolve_dataset_spec
from .instantiate import build_object, call_named, instantiate
from .schema import ConfigError, spec_name_and_kwargs
from .spec import Protocol, RunSpec
from .transforms import build_transforms


def build_splits(config: Mapping, seed: int) -> dict[str, torch.utils.data.Dataset]:
    """Datasets -> ``{split name: dataset}``.

    Either one ``dataset`` cut by ``split:`` (``split: {<split function>: {...}, names: [train,
    val, test], query_gallery: {test: [query, gallery], fraction: 0.5}}``; without ``split`` the
    whole dataset is ``train``), or ``datasets: {split name: dataset spec}`` taking each split
    from a reader's published split (``CUB200(split=test)``, In-Shop ``query``/``gallery``, ...).
    ``split: {mlrc_protocol: {...}, fold: k}`` gives fold k of the MLRC protocol (see
    ``experiment.mlrc``; all folds are run by :func:`~pml_rank_plugins.running.train_mlrc`).
    ``transforms.train`` feeds the ``train`` split, ``transforms.eval`` the others; relative dataset
    paths are resolved against ``data_root``. ``config``: a
    :class:`~pml_rank_plugins.experiment.RunSpec` (its protocol is read, not resolved again) or a
    config mapping.
    """
    protocol = config.protocol if isinstance(config, RunSpec) else Protocol.parse(config)
    config = config.config if isinstance(config, RunSpec) else config
    transforms = build_transforms(config) or {}
    if "datasets" in config and "dataset" in config:
        raise ConfigError("give either 'dataset' (with 'split') or 'datasets', not both")
    split = dict(config.get("split") or {})
    if protocol.is_mlrc:
        return mlrc_fold_splits(config, transforms)
    if "datasets" in config:
        if split:
            raise ConfigError(
                "split: with 'datasets' every split is given already; 'split' only takes "
                "{mlrc_protocol: {...}} there (folds over datasets.trainval)"
            )
        specs = config["datasets"]
        if not isinstance(specs, dict) or not specs:
            raise ConfigError("datasets: expected {split name: {DatasetClass: {kwargs}}}")
        return {
            name: build_dataset(config, spec, f"datasets.{name}", transforms.get(_kind(name)))
            for name, spec in specs.items()
        }
    dataset = build_dataset(config, config["dataset"], "dataset", transforms.get("eval"))
    train_dataset = dataset
    if transforms:
        train_dataset = build_dataset(config, config["dataset"], "dataset", transforms["train"])
        if not np.array_equal(np.asarray(train_dataset.labels), np.asarray(dataset.labels)):
            raise ConfigError("dataset: two builds gave different labels (must be deterministic)")
    names = list(split.pop("names", ["train", "test"]))
    qg = dict(split.pop("query_gallery", None) or {})
    split.pop("fold", None)
    if not split:
        return {"train": train_dataset}
    fn_name, fn_kwargs = spec_name_and_kwargs(split, "split")
    fn = registry.resolve(fn_name, "split")
    parts = call_named(
        "split", fn_name, fn, np.asarray(dataset.labels), **instantiate(fn_kwargs, "split")
    )
    mlrc.check_split_parts(fn_name, parts, names)

    def subset(name, idx):
        return LabeledSubset(train_dataset if name == "train" else dataset, idx)

    out = {n: subset(n, idx) for n, idx in zip(names, parts, strict=True)}
    fraction = float(qg.pop("fraction", 0.5))
    qg_seed = int(qg.pop("seed", 0))
    for source, (qname, gname) in qg.items():
        if source not in out:
            raise ConfigError(f"split.query_gallery: no split named {source!r} in {names}")
        base = out.pop(source)
        base_idx = np.asarray(base.indices)
        q, g = query_gallery_split(base.labels, fraction, qg_seed)
        out[qname] = subset(qname, base_idx[q])
        out[gname] = subset(gname, base_idx[g])
    return out


def _kind(split_name: str) -> str:
    return "train" if split_name == "train" else "eval"


def build_dataset(config: dict, spec: Any, where: str, transform=None):
    """One dataset from its spec: paths resolved against ``data_root`` (missing folder: a
    :class:`ConfigError` naming the key and the published archive), ``transform`` injected.

    A ``transform`` keyword in the spec itself is refused: the run's transform is the top-level
    ``transforms`` (one place, read alike by training, its evaluation, ``load_run`` and ``pml-rank
    embed``); a dataset's own would feed the train split's augmentation to the evaluation, and
    ``embed --images`` (which has no dataset to ask) would feed images without it."""
    spec = resolve_dataset_spec(spec, where, config.get("data_root"))
    name, kwargs = spec_name_and_kwargs(spec, where)
    if "transform" in kwargs:
        raise ConfigError(
            f"{where}.{name}.transform: a dataset's own transform is not the run's transform "
            "(load_run and `pml-rank embed --images` apply transforms.eval, so a model trained "
            "with it would embed images without it); move it to the top-level "
            "transforms: {train: [...], eval: [...]} (eval feeds every split but train, and "
            "embed; see docs/configs.md)"
        )
    injected = {"transform": transform} if transform is not None else {}
    dataset = build_object(spec, where, **injected)
    if not hasattr(dataset, "labels"):
        raise ConfigError(
            f"{where}: the dataset must expose .labels, the (N, 2) [class, category] label array "
            "(pml_rank_plugins.data.as_two_level builds it; string labels: encode_labels). For a "
            "folder with one sub-folder per class use ImageFolderDataset: {root: DIR}; for a list "
            "of 'path label' lines, LandmarksList: {root: DIR, list_file: FILE}"
        )
    return dataset


def mlrc_fold_splits(config: dict, transforms: dict) -> dict:
    """``{train, val, test, ...}`` of fold ``split.fold`` (train: the other folds' classes)."""
    split = config.get("split") or {}
    if "names" in split or "query_gallery" in split:
        raise ConfigError(
            "split: mlrc_protocol makes fixed splits (train and val of each fold, test); remove "
            "split.names / split.query_gallery and use eval: {validation: [val], test: [test]}"
        )
    fold = mlrc.mlrc_fold(config)
    num_folds = mlrc.mlrc_num_folds(config)
    if fold is None:
        raise ConfigError(
            "split.fold: the MLRC protocol trains one model per fold; `pml-rank train` and "
            "`compare` run every fold (and the concatenated/separated test) themselves. To build "
            "or train one fold alone, --set split.fold=K (0 <= K < num_folds)"
        )
    if not 0 <= fold < num_folds:
        raise ConfigError(f"split.fold: {fold} is not in 0..{num_folds - 1}")
    _, _, kwargs = mlrc._split_function(config)
    kwargs = instantiate(kwargs, "split.mlrc_protocol")

    def both(spec, where):
        ev = build_dataset(config, spec, where, transforms.get("eval"))
        tr = build_dataset(config, spec, where, transforms["train"]) if transforms else ev
        return tr, ev

    if "datasets" in config:
        specs = config["datasets"]
        if "trainval" not in specs:
            raise ConfigError(
                "datasets: with split: {mlrc_protocol: ...} name the training half 'trainval' "
                f"(folds are cut from it) and the test half 'test'; have {sorted(specs)}"
            )
        train_ds, eval_ds = both(specs["trainval"], "datasets.trainval")
        labels = np.asarray(eval_ds.labels)
        folds = class_disjoint_kfold(labels, num_folds, kwargs.get("seed"))
        out = {
            "train": LabeledSubset(train_ds, folds[fold][0]),
            "val": LabeledSubset(eval_ds, folds[fold][1]),
        }
        for name, spec in specs.items():
            if name != "trainval":
                out[name] = build_dataset(config, spec, f"datasets.{name}", transforms.get("eval"))
        return out
    train_ds, eval_ds = both(config["dataset"], "dataset")
    folds, test = mlrc_protocol(np.asarray(eval_ds.labels), **kwargs)
    return {
        "train": LabeledSubset(train_ds, folds[fold][0]),
        "val": LabeledSubset(eval_ds, folds[fold][1]),
        "test": LabeledSubset(eval_ds, test),
    }
