"""Running the MLRC protocol: one ordinary run per fold, then the concatenated/separated test.

The protocol (Musgrave, Belongie, Lim, ECCV 2020) and its config are described in
:mod:`pml_rank_plugins.experiment.mlrc`. :func:`train_mlrc` trains fold k into ``RUN_DIR/fold<k>``
(each an ordinary run of :func:`.training.train_run`), then :func:`mlrc_test` embeds the test
splits with every fold's weights and writes ``RUN_DIR/metrics.json``.

``RUN_DIR`` follows the single-run folder policy (:mod:`.run_folder`): it is locked for the whole
call (a second MLRC train into it is refused with :class:`.run_folder.RunFolderBusy`), a used
folder is refused unless ``--resume`` or ``--overwrite``, and ``--overwrite`` removes only what
a run of ours wrote (:data:`MLRC_FILES` and the run outputs inside ``fold<k>`` for the config's
folds), never other files or folders.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch

from ..experiment import builder
from ..experiment.datasets import build_splits
from ..experiment.schema import ConfigError, dump_yaml
from ..experiment.spec import RunSpec
from . import distributed, run_folder
from .checkpoints import choose_checkpoint, load_models
from .evaluate import evaluate_run
from .training import load_run_config, train_run

LOGGER = logging.getLogger(__name__)
MLRC_OUTPUTS = ("concatenated", "separated")
# What an MLRC train writes at the top of its folder (besides fold<k>/, each an ordinary run).
MLRC_FILES = ("config.yaml", "metrics.json", "eval.json")


def train_mlrc(
    config: RunSpec | dict,
    run_dir: str | Path,
    resume: bool = False,
    stop_after_epoch: int | None = None,
    device: str | None = None,
    overwrite: bool = False,
) -> dict:
    """Train every fold into ``run_dir/fold<k>`` then write the protocol's ``metrics.json``.

    Args:
        config: an MLRC spec (``split: {mlrc_protocol: ...}`` without ``split.fold``; a config
            mapping is parsed).
        run_dir: the protocol's folder.
        resume: continue: finished folds are kept, the others resume from their ``latest.pt``.
        stop_after_epoch: stop a fold early as if interrupted (tests, budgeted runs).
        device: overrides the config's ``device``.
        overwrite: replace an earlier run in ``run_dir`` (only its outputs are removed).

    Returns:
        The ``metrics.json`` content (or ``{"interrupted_after_epoch", "fold"}``).

    Raises:
        RunFolderBusy: another live run holds ``run_dir``.
        RunFolderError: ``run_dir`` holds a run and neither ``resume`` nor ``overwrite`` is set.
    """
    run_dir = Path(run_dir)
    spec = load_run_config(config, run_dir)
    with run_folder.lock(run_dir) if distributed.is_main_process() else contextlib.nullcontext():
        return _train_folds(spec, run_dir, resume, stop_after_epoch, device, overwrite)


def prepare_mlrc(run_dir: Path, num_folds: int, resume: bool, overwrite: bool) -> None:
    """:func:`.run_folder.prepare` for an MLRC folder (call while holding its lock).

    A fresh protocol run into a folder that holds :data:`MLRC_FILES` or a fold run is refused
    (touching nothing) unless ``overwrite``; that removes :data:`MLRC_FILES` and, in each
    ``fold<k>`` (k < ``num_folds``), only the run outputs (:data:`.run_folder.RUN_OUTPUTS`,
    under the fold's own lock). Other files and folders (``folders_backup/``...) stay.
    """
    if resume:
        return
    folds = [run_dir / f"fold{k}" for k in range(num_folds)]
    used = [name for name in MLRC_FILES if (run_dir / name).exists()]
    used += [f"{f.name}: {d}" for f in folds if f.is_dir() and (d := run_folder.describe_run(f))]
    if not used:
        return
    found = f"an MLRC run ({'; '.join(used)})"
    if not overwrite:
        raise run_folder.RunFolderError(
            f"{run_dir} already holds {found}; pass --resume to continue it, --overwrite to "
            "replace it, or give another --out"
        )
    LOGGER.warning("--overwrite: removing %s from %s", found, run_dir)
    for fold in folds:
        if fold.is_dir() and not fold.is_symlink():
            with run_folder.lock(fold):
                run_folder.prepare(fold, resume=False, overwrite=True)
    for name in MLRC_FILES:
        (run_dir / name).unlink(missing_ok=True)


def _train_folds(spec: RunSpec, run_dir: Path, resume, stop_after_epoch, device, overwrite):
    t0 = time.perf_counter()
    num_folds = spec.protocol.num_folds
    if distributed.is_main_process():
        prepare_mlrc(run_dir, num_folds, resume, overwrite)
        with run_folder.disk_full_as_error(run_dir / "config.yaml"):
            dump_yaml(spec.config, run_dir / "config.yaml")
    fold_metrics = []
    for k in range(num_folds):
        fold_dir = run_dir / f"fold{k}"
        done = fold_dir / "metrics.json"
        if resume and done.exists():
            m = json.loads(done.read_text())
        else:
            m = train_run(spec.fold(k), fold_dir, resume, stop_after_epoch, device)
        if "interrupted_after_epoch" in m:
            return {"interrupted_after_epoch": m["interrupted_after_epoch"], "fold": k}
        fold_metrics.append(m)
    test = mlrc_test(spec, run_dir, "best", device, [m["test"] for m in fold_metrics])
    metrics = {
        "name": spec.get("name", run_dir.name),
        "seed": spec.seed,
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
    run_folder.write_text(run_dir / "metrics.json", json.dumps(metrics, indent=2))
    return metrics


def evaluate_mlrc(
    run_dir: str | Path,
    which: str = "best",
    device: str | None = None,
    data_root=None,
    spec: RunSpec | None = None,
) -> dict:
    """Re-evaluate every fold (``fold<k>/eval.json``) and the concatenated/separated test.
    ``spec``: the protocol folder's spec when the caller loaded it already."""
    run_dir = Path(run_dir)
    spec = spec if spec is not None else RunSpec.load(run_dir, data_root)
    folds = [
        evaluate_run(run_dir / f"fold{k}", which, device, data_root)
        for k in range(spec.protocol.num_folds)
    ]
    out = mlrc_test(spec, run_dir, which, device, folds)
    out["folds"] = folds
    run_folder.write_text(run_dir / "eval.json", json.dumps(out, indent=2))
    return out


def mlrc_test(spec: RunSpec, run_dir: Path, which: str, device, fold_tests: list[dict]) -> dict:
    """``{"test": {concatenated, separated}, "embedding_dim": {...}}`` for the test entries.

    ``fold_tests[k]`` is fold k's ``{split: metrics}`` (from its own run); ``separated`` is their
    mean. ``concatenated`` embeds the test splits with every fold's ``which`` weights,
    concatenates along the feature axis (k x dim) and scores with the configured calculator.
    """
    spec = RunSpec.of(spec)
    dev = spec.torch_device(device)
    datasets = build_splits(spec.fold(0), spec.seed)
    s2e = builder.splits_to_eval(spec.eval.entries(["test"]), datasets)
    if not s2e:
        raise ConfigError("eval.test: the MLRC protocol needs a test entry (e.g. test: [test])")
    tester = builder.build_tester(spec, dev)
    needed = sorted({q for q, _ in s2e} | {r for _, refs in s2e for r in refs})
    per_fold: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = []
    for k in range(len(fold_tests)):
        fold_dir = run_dir / f"fold{k}"
        models = builder.build_models(spec.fold(k).config, dev)
        load_models(models, choose_checkpoint(fold_dir, which))
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
