"""Evaluation of a run: the PML tester over the config's split entries, the Revisited test sets,
and ``pml-rank eval RUN_DIR`` (rebuild a saved run, load a checkpoint, score every split).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from ..experiment import builder
from ..experiment.revisited import build_revisited, revisited_entries
from ..experiment.spec import RunSpec
from ..experiment.spec import read_run_config as _read_config
from ..experiment.transforms import collate_for
from ..functional.revisited import revisited_evaluate
from .checkpoints import (
    WEIGHTS_KEYS,
    check_models,
    choose_checkpoint,
    load_checkpoint,
    load_state_dicts,
)
from .run_folder import write_text


def strip_level(accuracies: dict) -> dict:
    """PML keys ``precision_at_1_level0`` -> ``precision_at_1`` (level 0 = class labels)."""
    out = {}
    for k, v in accuracies.items():
        if k == "epoch":
            continue
        out[k[: -len("_level0")] if k.endswith("_level0") else k] = float(v)
    return out


def run_eval(tester, exp: builder.Experiment, entries: list, epoch: int) -> dict:
    """``{query split: {metric: value}}`` for the config split entries (PML tester)."""
    s2e = builder.splits_to_eval(copy.deepcopy(entries), exp.datasets)
    if not s2e:
        return {}
    names = {q for q, _ in s2e} | {r for _, refs in s2e for r in refs}
    datasets = {n: exp.datasets[n] for n in names}
    collate = collate_for(datasets[s2e[0][0]], "evaluation")  # unequal sizes: name the key
    all_acc = tester.test(
        datasets,
        epoch,
        exp.models["trunk"],
        exp.models["embedder"],
        splits_to_eval=s2e,
        collate_fn=collate,
    )
    return {split: strip_level(acc) for split, acc in all_acc.items()}


def revisited_eval(config: dict, models: dict, tester) -> dict:
    """``{name: revisited metrics}`` for every ``eval.revisited`` entry (empty if none)."""
    entries = revisited_entries(config)
    if not entries:
        return {}
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


def read_run_config(run_dir: str | Path, data_root: str | None = None) -> dict:
    """The saved ``RUN_DIR/config.yaml`` as written, not validated
    (``experiment.spec.read_run_config``; :exc:`~pml_rank_plugins.running.RunFolderError` when
    ``run_dir`` is not a run folder); ``data_root`` replaces the saved one (data moved since
    training). :meth:`~pml_rank_plugins.experiment.RunSpec.load` parses it too."""
    config = _read_config(run_dir)
    if data_root is not None:
        config["data_root"] = str(data_root)
    return config


def evaluate_run(
    run_dir: str | Path,
    which: str = "best",
    device: str | None = None,
    data_root: str | None = None,
    spec: RunSpec | None = None,
) -> dict:
    """Rebuild one (non-MLRC) run, load ``which`` weights and evaluate every eval split.

    Writes and returns ``RUN_DIR/eval.json``: ``{split: {metric: value}}``. ``data_root``
    replaces the saved config's (data moved since training). MLRC runs go through
    :func:`~pml_rank_plugins.running.evaluate`, which dispatches per fold. ``spec``: the
    run's spec when the caller loaded it already (``RunSpec.load(run_dir, data_root)``).
    """
    run_dir = Path(run_dir)
    spec = spec if spec is not None else RunSpec.load(run_dir, data_root)
    path = choose_checkpoint(run_dir, which)
    ckpt = load_checkpoint(path, required=WEIGHTS_KEYS)  # before building: fails in a second
    exp = builder.build_experiment(spec, device)
    check_models(exp.models, ckpt["models"], path)  # wrong weights: one line, nothing loaded
    load_state_dicts(exp.models, ckpt["models"])
    entries = exp.eval_entries("validation", "test")
    tester = builder.build_tester(spec, exp.device)
    out = {"checkpoint": path.name, "epoch": ckpt["epoch"]}
    out.update(run_eval(tester, exp, entries, ckpt["epoch"]))
    out.update(revisited_eval(spec.config, exp.models, tester))
    write_text(run_dir / "eval.json", json.dumps(out, indent=2))
    return out
