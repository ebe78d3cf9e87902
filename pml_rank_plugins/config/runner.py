"""Train / resume / evaluate one experiment with PML's trainer, tester and logging presets.

Run directory layout::

    RUN_DIR/config.yaml              the resolved config (what ``eval`` and ``--resume`` rebuild)
    RUN_DIR/checkpoints/latest.pt    written atomically after every epoch (models, optimizers,
                                     schedulers, loss/miner state, RNG states, history)
    RUN_DIR/checkpoints/best.pt      model weights of the best validation epoch
    RUN_DIR/logs/                    record-keeper CSV files + logs.db (SQLite)
    RUN_DIR/tensorboard/             tensorboard events
    RUN_DIR/metrics.json             validation history, best epoch, test metrics

Each epoch is one call to PML's ``trainer.train(start_epoch=e, num_epochs=e)`` preceded by
``sampler.set_epoch(e)``, so an epoch's batches depend only on the checkpointed state: a run
interrupted after epoch e and resumed reaches bit-identical weights to an uninterrupted one.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pytorch_metric_learning.utils import logging_presets

from . import builder, distributed
from .schema import dump_yaml, load_yaml, validate

LOGGER = logging.getLogger(__name__)
LOG_FREQ = 10


def plain(value: Any) -> Any:
    """Deep copy with tuples as lists, so a config equals its YAML round trip."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


# --------------------------------------------------------------------------- checkpoints


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to a temporary file in the same folder, then ``os.replace`` (atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def rng_state() -> dict:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _state_dicts(objs: dict) -> dict:
    return {k: v.state_dict() for k, v in objs.items() if hasattr(v, "state_dict")}


def _load_state_dicts(objs: dict, states: dict) -> None:
    for k, s in states.items():
        if k in objs:
            objs[k].load_state_dict(s)


def sampler_state(sampler) -> Any:
    """The sampler's state: ``state_dict()`` if it has one, else a copy of its attributes.

    PML's ``MPerClassSampler`` reshuffles its own label list in place every epoch, so the
    sampler object itself carries state that the RNG states alone do not capture.
    """
    if sampler is None:
        return None
    if hasattr(sampler, "state_dict"):
        return {"state_dict": sampler.state_dict()}
    return {"attributes": copy.deepcopy(vars(sampler))}


def load_sampler_state(sampler, state) -> None:
    if sampler is None or state is None:
        return
    if "state_dict" in state:
        sampler.load_state_dict(state["state_dict"])
    else:
        vars(sampler).update(copy.deepcopy(state["attributes"]))


def make_checkpoint(exp: builder.Experiment, epoch: int, history: list, best: dict) -> dict:
    sampler = exp.sampler
    return {
        "epoch": epoch,
        "models": _state_dicts(exp.models),
        "optimizers": _state_dicts(exp.optimizers),
        "lr_schedulers": _state_dicts(exp.lr_schedulers),
        "loss_funcs": _state_dicts(exp.loss_funcs),
        "mining_funcs": _state_dicts(exp.mining_funcs),
        "sampler": sampler_state(sampler),
        "rng": rng_state(),
        "extra": _state_dicts({k: v for k, v in exp.extra.items() if v is not None}),
        "history": history,
        "best": best,
    }


def restore_checkpoint(exp: builder.Experiment, ckpt: dict) -> None:
    _load_state_dicts(exp.models, ckpt["models"])
    _load_state_dicts(exp.optimizers, ckpt["optimizers"])
    _load_state_dicts(exp.lr_schedulers, ckpt["lr_schedulers"])
    _load_state_dicts(exp.loss_funcs, ckpt["loss_funcs"])
    _load_state_dicts(exp.mining_funcs, ckpt["mining_funcs"])
    load_sampler_state(exp.sampler, ckpt.get("sampler"))
    _load_state_dicts(exp.extra, ckpt.get("extra", {}))  # e.g. the float16 GradScaler
    set_rng_state(ckpt["rng"])


def load_checkpoint(path: str | Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


# --------------------------------------------------------------------------- metrics


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
    all_acc = tester.test(
        datasets, epoch, exp.models["trunk"], exp.models["embedder"], splits_to_eval=s2e
    )
    return {split: strip_level(acc) for split, acc in all_acc.items()}


def _split_name(entry) -> str:
    return entry if isinstance(entry, str) else entry["query"]


# --------------------------------------------------------------------------- logging


def make_logging(run_dir: Path, primary_metric: str, val_split: str | None, resume: bool):
    """PML ``logging_presets`` record keeper (CSV + SQLite + tensorboard) and hook container."""
    record_keeper, _, tb_writer = logging_presets.get_record_keeper(
        str(run_dir / "logs"), str(run_dir / "tensorboard"), is_new_experiment=not resume
    )
    hooks = logging_presets.get_hook_container(
        record_keeper,
        primary_metric=primary_metric,
        validation_split_name=val_split or "val",
        save_models=False,
        log_freq=LOG_FREQ,
    )
    return record_keeper, tb_writer, hooks


# --------------------------------------------------------------------------- train


def train(
    config: dict | None,
    run_dir: str | Path,
    resume: bool = False,
    stop_after_epoch: int | None = None,
    device: str | None = None,
) -> dict:
    """Train one experiment into ``run_dir`` and return the ``metrics.json`` content.

    ``resume=True`` continues from ``checkpoints/latest.pt`` (``config`` may be ``None`` to reuse
    ``run_dir/config.yaml``). ``stop_after_epoch`` stops early as if interrupted (for tests and
    budgeted runs); the run can then be resumed.
    """
    run_dir = Path(run_dir)
    saved_cfg = run_dir / "config.yaml"
    ckpt_path = run_dir / "checkpoints" / "latest.pt"
    if config is None:
        if not saved_cfg.exists():
            raise FileNotFoundError(f"{saved_cfg} not found: give a config")
        config = load_yaml(saved_cfg)
    config = plain(config)
    validate(config)
    # torchrun: one process per device; only rank 0 writes files and evaluates
    ctx = distributed.setup(device or config.get("device"))
    main = ctx.is_main
    resuming = distributed.broadcast_object(resume and ckpt_path.exists())
    if resume and not resuming and main:
        LOGGER.warning("--resume: no checkpoint in %s; starting from scratch", run_dir)
    if not resuming and main:  # a fresh run must not append to an older run's logs
        for stale in ("logs", "tensorboard", "checkpoints"):
            shutil.rmtree(run_dir / stale, ignore_errors=True)
        for stale in ("metrics.json", "eval.json"):
            (run_dir / stale).unlink(missing_ok=True)
    if resuming and saved_cfg.exists() and load_yaml(saved_cfg) != config:
        raise ValueError(f"--resume: config differs from {saved_cfg}; resume with the same config")
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        dump_yaml(config, saved_cfg)
    distributed.barrier()

    t0 = time.perf_counter()
    exp = builder.build_experiment(config, ctx.device)
    ev = builder.eval_settings(config)
    val_entries, test_entries = list(ev["validation"] or []), list(ev["test"] or [])
    val_entries = [e for e in val_entries if _split_name(e) in exp.datasets]
    primary = ev["primary_metric"]
    val_split = _split_name(val_entries[0]) if val_entries else None

    history: list[dict] = []
    best = {"epoch": None, "value": None}
    start_epoch, stopped_early = 1, False
    if resuming:
        ckpt = distributed.broadcast_object(load_checkpoint(ckpt_path) if main else None)
        restore_checkpoint(exp, ckpt)
        history, best = ckpt["history"], ckpt["best"]
        stopped_early = bool(ckpt.get("stopped_early", False))
        start_epoch = exp.num_epochs + 1 if stopped_early else ckpt["epoch"] + 1
        LOGGER.info("resuming %s at epoch %d", run_dir, start_epoch)

    record_keeper = tb_writer = tester = None
    if main:
        record_keeper, tb_writer, hooks = make_logging(run_dir, primary, val_split, resuming)
        tester = builder.build_tester(config, exp.device, hooks.end_of_testing_hook)
    trainer = builder.make_trainer(
        exp, end_of_iteration_hook=hooks.end_of_iteration_hook if main else None
    )

    for epoch in range(start_epoch, exp.num_epochs + 1):
        if hasattr(exp.sampler, "set_epoch"):
            exp.sampler.set_epoch(epoch)
        trainer.train(start_epoch=epoch, num_epochs=epoch)
        row: dict[str, Any] = {"epoch": epoch}
        if val_entries and (epoch % int(ev["test_interval"]) == 0 or epoch == exp.num_epochs):
            row["validation"] = distributed.broadcast_object(
                run_eval(tester, exp, val_entries, epoch) if main else None
            )
            distributed.sync_rng_state(rng_state, set_rng_state)
            value = row["validation"][val_split].get(primary)
            trainer.step_lr_plateau_schedulers(value)
            if value is not None and (best["value"] is None or value > best["value"]):
                best = {"epoch": epoch, "value": value}
                if main:
                    atomic_torch_save(
                        {"epoch": epoch, "models": _state_dicts(exp.models)},
                        run_dir / "checkpoints" / "best.pt",
                    )
        history.append(row)
        if record_keeper is not None:
            record_keeper.save_records()
        patience = ev["patience"]
        if patience is not None and best["epoch"] is not None and epoch - best["epoch"] > patience:
            LOGGER.info("validation %s plateaued for %d epochs; stopping", primary, patience)
            stopped_early = True
        if main:
            ckpt = make_checkpoint(exp, epoch, history, best)
            ckpt["stopped_early"] = stopped_early
            atomic_torch_save(ckpt, ckpt_path)
        if stopped_early:
            break
        if stop_after_epoch is not None and epoch >= stop_after_epoch and epoch < exp.num_epochs:
            if tb_writer is not None:
                tb_writer.close()
            distributed.barrier()
            return {"interrupted_after_epoch": epoch, "history": history, "best": best}

    # Final test: the best validation epoch's weights (the last epoch's without validation).
    if best["epoch"] is not None and main:
        _load_state_dicts(
            exp.models, load_checkpoint(run_dir / "checkpoints" / "best.pt")["models"]
        )
    final_epoch = best["epoch"] if best["epoch"] is not None else history[-1]["epoch"]
    test = run_eval(tester, exp, test_entries, final_epoch) if test_entries and main else {}
    test = distributed.broadcast_object(test)
    if not test and val_entries and best["epoch"] is not None:
        test = next(h["validation"] for h in history if h["epoch"] == best["epoch"])
    if record_keeper is not None:
        record_keeper.save_records()
    if tb_writer is not None:
        tb_writer.close()
    metrics = {
        "name": config.get("name", run_dir.name),
        "seed": exp.seed,
        "epochs_run": history[-1]["epoch"] if history else 0,
        "stopped_early": stopped_early,
        "best": best,
        "history": history,
        "test": test,
        "train_seconds_this_call": time.perf_counter() - t0,
        "run_info": distributed.run_info(ctx, exp.extra.get("amp")),
    }
    if main:
        (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    distributed.barrier()
    return metrics


def evaluate(run_dir: str | Path, which: str = "best", device: str | None = None) -> dict:
    """Rebuild a finished/interrupted run, load ``which`` weights and evaluate every eval split.

    Writes and returns ``RUN_DIR/eval.json``: ``{split: {metric: value}}``.
    """
    run_dir = Path(run_dir)
    config = load_yaml(run_dir / "config.yaml")
    exp = builder.build_experiment(config, device)
    path = run_dir / "checkpoints" / f"{which}.pt"
    if not path.exists():
        path = run_dir / "checkpoints" / "latest.pt"
    ckpt = load_checkpoint(path)
    _load_state_dicts(exp.models, ckpt["models"])
    ev = builder.eval_settings(config)
    entries = [e for e in list(ev["validation"] or []) + list(ev["test"] or [])]
    entries = [e for e in entries if _split_name(e) in exp.datasets]
    tester = builder.build_tester(config, exp.device)
    out = {"checkpoint": path.name, "epoch": ckpt["epoch"]}
    out.update(run_eval(tester, exp, entries, ckpt["epoch"]))
    (run_dir / "eval.json").write_text(json.dumps(out, indent=2))
    return out
