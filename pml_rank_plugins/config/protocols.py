"""Evaluation protocols beyond one train/val/test run: MLRC cross-validation and Revisited
Oxford/Paris test sets.

**MLRC** (Musgrave, Belongie, Lim, "A Metric Learning Reality Check", ECCV 2020). Selected by the
split function ``mlrc_protocol``::

    dataset: {CUB200: {root: CUB_200_2011, split: all}}
    split: {mlrc_protocol: {num_folds: 4}}      # first half of the classes -> 4 class-disjoint
                                                # folds; second half -> test
    eval: {validation: [val], test: [test]}

or, where a reader publishes the two halves itself (SOP's ``Ebay_train``/``Ebay_test``)::

    datasets: {trainval: {...split: train}, test: {...split: test}}
    split: {mlrc_protocol: {num_folds: 4}}      # folds over datasets.trainval

``pml-rank train`` then trains one model per fold into ``RUN_DIR/fold<k>/`` (an ordinary run:
``split.fold = k``, train on the other folds' classes, validate on fold k's, test on the test
half) and writes ``RUN_DIR/metrics.json`` whose ``test`` holds

* ``concatenated``: the metrics of the k models' embeddings concatenated (k x dim; each model's
  embeddings L2-normalized first when the tester normalizes, as PML's does by default);
* ``separated``: each model's own test metrics, averaged over the folds (``folds`` lists them).

``--set split.fold=K`` trains fold K alone as an ordinary run.

**Revisited Oxford / Paris** (Radenovic et al., CVPR 2018) as test sets::

    eval:
      revisited:
        - dataset: {RevisitedOxfordParis: {root: revisitop, name: roxford5k}}
          batch_size: 1        # optional: full-size images differ in size
          ks: [1, 5, 10]       # optional: mP@k

Each entry builds the reader's ``query`` and ``database`` splits (``split`` is injected, and the
``transforms.eval`` list unless the entry gives ``transform: [...]``), embeds both with the
trained trunk + embedder, and adds ``test[<name>]`` with ``map_easy``, ``map_medium``,
``map_hard``, ``mp_at_<k>_<protocol>`` and ``num_queries_<protocol>``
(:func:`pml_rank_plugins.config.revisited.revisited_evaluate`).
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import registry
from .schema import ConfigError, dump_yaml, spec_name_and_kwargs

LOGGER = logging.getLogger(__name__)
MLRC_OUTPUTS = ("concatenated", "separated")


# --------------------------------------------------------------------------- MLRC: config


def _split_function(config: dict):
    split = {k: v for k, v in (config.get("split") or {}).items() if k not in _SPLIT_KEYS}
    if not split:
        return None, None, {}
    name, kwargs = spec_name_and_kwargs(split, "split")
    return name, registry.resolve(name), kwargs


_SPLIT_KEYS = ("names", "query_gallery", "fold")


def is_mlrc(config: dict) -> bool:
    """True when ``split:`` names the ``mlrc_protocol`` function."""
    from pml_rank_plugins.data.splits import mlrc_protocol

    _, fn, _ = _split_function(config)
    return fn is mlrc_protocol


def mlrc_fold(config: dict) -> int | None:
    fold = (config.get("split") or {}).get("fold")
    return None if fold is None else int(fold)


def mlrc_num_folds(config: dict) -> int:
    _, _, kwargs = _split_function(config)
    return int(kwargs.get("num_folds", 4))


def mlrc_fold_config(config: dict, fold: int) -> dict:
    """The ordinary single-run config of fold ``fold``."""
    cfg = copy.deepcopy(config)
    cfg["split"]["fold"] = int(fold)
    return cfg


def check_split_parts(fn_name: str, parts: Any, names: list) -> None:
    """A split function must return one index array per name; explain what went wrong."""
    if not isinstance(parts, (list, tuple)) or any(
        not (isinstance(p, np.ndarray) and p.ndim == 1 and np.issubdtype(p.dtype, np.integer))
        for p in parts
    ):
        raise ConfigError(
            f"split: {fn_name} must return one 1-D index array per name in split.names "
            f"({names}); it returned {type(parts).__name__} of "
            f"{[type(p).__name__ for p in parts] if isinstance(parts, (list, tuple)) else '?'}. "
            "For cross-validation folds use the MLRC protocol: split: {mlrc_protocol: "
            "{num_folds: 4}} (one model per fold, see pml_rank_plugins.config.protocols)."
        )
    if len(parts) != len(names):
        raise ConfigError(
            f"split: {fn_name} returned {len(parts)} parts for names {names}; "
            f"set split.names to {len(parts)} names"
        )


def mlrc_fold_splits(config: dict, transforms: dict) -> dict:
    """``{train, val, test, ...}`` of fold ``split.fold`` (train: the other folds' classes)."""
    from pml_rank_plugins.data.splits import class_disjoint_kfold, mlrc_protocol

    from .builder import build_dataset, instantiate
    from .splits import labeled_subset

    split = config.get("split") or {}
    if "names" in split or "query_gallery" in split:
        raise ConfigError(
            "split: mlrc_protocol makes fixed splits (train and val of each fold, test); remove "
            "split.names / split.query_gallery and use eval: {validation: [val], test: [test]}"
        )
    fold = mlrc_fold(config)
    num_folds = mlrc_num_folds(config)
    if fold is None:
        raise ConfigError(
            "split.fold: the MLRC protocol trains one model per fold; `pml-rank train` and "
            "`compare` run every fold (and the concatenated/separated test) themselves. To build "
            "or train one fold alone, --set split.fold=K (0 <= K < num_folds)"
        )
    if not 0 <= fold < num_folds:
        raise ConfigError(f"split.fold: {fold} is not in 0..{num_folds - 1}")
    _, _, kwargs = _split_function(config)
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
            "train": labeled_subset(train_ds, folds[fold][0]),
            "val": labeled_subset(eval_ds, folds[fold][1]),
        }
        for name, spec in specs.items():
            if name != "trainval":
                out[name] = build_dataset(config, spec, f"datasets.{name}", transforms.get("eval"))
        return out
    train_ds, eval_ds = both(config["dataset"], "dataset")
    folds, test = mlrc_protocol(np.asarray(eval_ds.labels), **kwargs)
    return {
        "train": labeled_subset(train_ds, folds[fold][0]),
        "val": labeled_subset(eval_ds, folds[fold][1]),
        "test": labeled_subset(eval_ds, test),
    }


# --------------------------------------------------------------------------- MLRC: run


def train_mlrc(
    config: dict,
    run_dir: str | Path,
    resume: bool = False,
    stop_after_epoch: int | None = None,
    device: str | None = None,
) -> dict:
    """Train every fold into ``run_dir/fold<k>`` then write the protocol's ``metrics.json``."""
    from . import runner

    run_dir = Path(run_dir)
    t0 = time.perf_counter()
    if not resume:
        for stale in ("metrics.json", "eval.json"):
            (run_dir / stale).unlink(missing_ok=True)
        for old in run_dir.glob("fold*"):
            shutil.rmtree(old, ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_yaml(config, run_dir / "config.yaml")
    fold_metrics = []
    for k in range(mlrc_num_folds(config)):
        fold_dir = run_dir / f"fold{k}"
        done = fold_dir / "metrics.json"
        if resume and done.exists():
            m = json.loads(done.read_text())
        else:
            m = runner.train(
                mlrc_fold_config(config, k), fold_dir, resume, stop_after_epoch, device
            )
        if "interrupted_after_epoch" in m:
            return {"interrupted_after_epoch": m["interrupted_after_epoch"], "fold": k}
        fold_metrics.append(m)
    test = mlrc_test(config, run_dir, "best", device, [m["test"] for m in fold_metrics])
    metrics = {
        "name": config.get("name", run_dir.name),
        "seed": int(config.get("seed", 0)),
        "protocol": "mlrc",
        "num_folds": len(fold_metrics),
        "epochs_run": [m["epochs_run"] for m in fold_metrics],
        "stopped_early": [m["stopped_early"] for m in fold_metrics],
        "best": {
            "epoch": [m["best"]["epoch"] for m in fold_metrics],
            "value": _mean([m["best"]["value"] for m in fold_metrics]),
        },
        "history": _mean_history([m["history"] for m in fold_metrics]),
        "test": test["test"],
        "embedding_dim": test["embedding_dim"],
        "folds": [
            {"run_dir": f"fold{k}", "best": m["best"], "test": m["test"]}
            for k, m in enumerate(fold_metrics)
        ],
        "train_seconds_this_call": time.perf_counter() - t0,
    }
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return metrics


def evaluate_mlrc(
    run_dir: str | Path, which: str = "best", device: str | None = None, data_root=None
) -> dict:
    """Re-evaluate every fold (``fold<k>/eval.json``) and the concatenated/separated test."""
    from . import runner
    from .schema import load_yaml

    run_dir = Path(run_dir)
    config = load_yaml(run_dir / "config.yaml")
    if data_root is not None:
        config["data_root"] = str(data_root)
    folds = [
        runner.evaluate(run_dir / f"fold{k}", which, device, data_root)
        for k in range(mlrc_num_folds(config))
    ]
    out = mlrc_test(config, run_dir, which, device, folds)
    out["folds"] = folds
    (run_dir / "eval.json").write_text(json.dumps(out, indent=2))
    return out


def mlrc_test(config: dict, run_dir: Path, which: str, device, fold_tests: list[dict]) -> dict:
    """``{"test": {concatenated, separated}, "embedding_dim": {...}}`` for the test entries.

    ``fold_tests[k]`` is fold k's ``{split: metrics}`` (from its own run); ``separated`` is their
    mean. ``concatenated`` embeds the test splits with every fold's ``which`` weights,
    concatenates along the feature axis (k x dim) and scores with the configured calculator.
    """
    from . import builder, runner

    ev = builder.eval_settings(config)
    cfg0 = mlrc_fold_config(config, 0)
    dev = torch.device(device or config.get("device") or "cpu")
    datasets = builder.build_splits(cfg0, int(config.get("seed", 0)))
    s2e = builder.splits_to_eval(copy.deepcopy(list(ev["test"] or [])), datasets)
    if not s2e:
        raise ConfigError("eval.test: the MLRC protocol needs a test entry (e.g. test: [test])")
    tester = builder.build_tester(config, dev)
    needed = sorted({q for q, _ in s2e} | {r for _, refs in s2e for r in refs})
    per_fold: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = []
    for k in range(len(fold_tests)):
        fold_dir = run_dir / f"fold{k}"
        path = fold_dir / "checkpoints" / f"{which}.pt"
        if not path.exists():
            path = fold_dir / "checkpoints" / "latest.pt"
        models = builder.build_models(mlrc_fold_config(config, k), dev)
        runner._load_state_dicts(models, runner.load_checkpoint(path)["models"])
        per_fold.append(
            {
                name: tester.get_all_embeddings(datasets[name], models["trunk"], models["embedder"])
                for name in needed
            }
        )
    calc = tester.accuracy_calculator
    single = len(s2e) == 1
    test: dict[str, dict] = {}
    for q, refs in s2e:
        query = torch.cat([f[q][0] for f in per_fold], dim=1)
        q_labels = _class_labels(per_fold[0][q][1])
        ref = torch.cat([torch.cat([f[r][0] for f in per_fold], dim=1) for r in refs])
        r_labels = torch.cat([_class_labels(per_fold[0][r][1]) for r in refs])
        acc = calc.get_accuracy(query, q_labels, ref, r_labels, ref_includes_query=q in refs)
        sep = {}
        for metric in sorted({m for t in fold_tests for m in t.get(q, {})}):
            sep[metric] = _mean([t.get(q, {}).get(metric) for t in fold_tests])
        names = MLRC_OUTPUTS if single else tuple(f"{q} {o}" for o in MLRC_OUTPUTS)
        test[names[0]] = {m: float(v) for m, v in acc.items()}
        test[names[1]] = sep
    dim = int(per_fold[0][needed[0]][0].shape[1])
    return {"test": test, "embedding_dim": {"concatenated": dim * len(per_fold), "separated": dim}}


def _class_labels(labels: torch.Tensor) -> torch.Tensor:
    return labels[:, 0] if labels.ndim == 2 else labels


def _mean(values) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def _mean_history(histories: list[list[dict]]) -> list[dict]:
    """Per epoch, the mean over folds of each validation metric (folds that ran that epoch)."""
    by_epoch: dict[int, dict[str, dict[str, list[float]]]] = {}
    for history in histories:
        for row in history:
            for split, metrics in (row.get("validation") or {}).items():
                slot = by_epoch.setdefault(row["epoch"], {}).setdefault(split, {})
                for m, v in metrics.items():
                    slot.setdefault(m, []).append(v)
    return [
        {
            "epoch": e,
            "validation": {
                s: {m: float(np.mean(v)) for m, v in ms.items()} for s, ms in by_epoch[e].items()
            },
        }
        for e in sorted(by_epoch)
    ]


# --------------------------------------------------------------------------- Revisited


def revisited_entries(config: dict) -> list[dict]:
    """The ``eval.revisited`` list, checked, with defaults (``name`` from the dataset's
    ``name`` keyword, ``ks`` (1, 5, 10), ``batch_size`` None = the tester's)."""
    entries = (config.get("eval") or {}).get("revisited") or []
    if not isinstance(entries, list):
        raise ConfigError("eval.revisited: expected a list of {dataset: {...}} entries")
    out = []
    allowed = {"dataset", "name", "ks", "batch_size", "transform"}
    for i, e in enumerate(entries):
        where = f"eval.revisited[{i}]"
        if not isinstance(e, dict) or "dataset" not in e:
            raise ConfigError(f"{where}: expected {{dataset: {{RevisitedOxfordParis: {{...}}}}}}")
        bad = set(e) - allowed
        if bad:
            raise ConfigError(f"{where}: unknown key(s) {sorted(bad)}; allowed {sorted(allowed)}")
        ds_name, kwargs = spec_name_and_kwargs(e["dataset"], f"{where}.dataset")
        if "split" in kwargs:
            raise ConfigError(
                f"{where}.dataset.{ds_name}.split: leave it out (query and database are built)"
            )
        out.append(
            {
                "where": where,
                "dataset": e["dataset"],
                "name": str(e.get("name") or kwargs.get("name") or ds_name),
                "ks": tuple(int(k) for k in e.get("ks", (1, 5, 10))),
                "batch_size": e.get("batch_size"),
                "transform": e.get("transform"),
            }
        )
    return out


def build_revisited(config: dict, entry: dict) -> tuple[Any, Any]:
    """The (query, database) datasets of one ``eval.revisited`` entry."""
    from .builder import build_dataset, build_object
    from .transforms import NamedCompose, build_transforms

    where = entry["where"]
    if entry["transform"] is not None:
        transform = NamedCompose(
            [build_object(t, f"{where}.transform[{i}]") for i, t in enumerate(entry["transform"])],
            f"{where}.transform",
        )
    else:
        transform = (build_transforms(config) or {}).get("eval")
    name, kwargs = spec_name_and_kwargs(entry["dataset"], f"{where}.dataset")
    out = []
    for split in ("query", "database"):
        spec = {name: {**kwargs, "split": split}}
        out.append(build_dataset(config, spec, f"{where}.dataset", transform))
    return out[0], out[1]


def revisited_eval(config: dict, models: dict, tester) -> dict:
    """``{name: revisited metrics}`` for every ``eval.revisited`` entry (empty if none)."""
    entries = revisited_entries(config)
    if not entries:
        return {}
    from .revisited import revisited_evaluate  # helper "data"'s metric (Radenovic et al.)
    from .transforms import collate_for

    out = {}
    for entry in entries:
        query_ds, db_ds = build_revisited(config, entry)
        old_bs = tester.batch_size
        if entry["batch_size"] is not None:
            tester.batch_size = int(entry["batch_size"])
        try:
            emb = [
                tester.get_all_embeddings(
                    ds,
                    models["trunk"],
                    models["embedder"],
                    collate_fn=collate_for(ds, f"{entry['where']} {part}"),
                )[0]
                for ds, part in ((query_ds, "query"), (db_ds, "database"))
            ]
        finally:
            tester.batch_size = old_bs
        metrics = revisited_evaluate(emb[0], emb[1], query_ds.gnd, ks=entry["ks"])
        out[entry["name"]] = {k: float(v) for k, v in metrics.items()}
    return out
