"""Train one run (one config, one folder) with PML's trainer, tester and logging presets.

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
MLRC configs (one run per fold) are dispatched by :func:`pml_rank_plugins.running.runner.train`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

from pytorch_metric_learning.utils import logging_presets

from ..experiment import builder
from ..experiment.schema import dump_yaml, load_yaml, validate
from . import distributed, nonfinite, run_folder
from .checkpoints import (
    LATEST_KEYS,
    atomic_torch_save,
    from_plain,
    load_checkpoint,
    load_models,
    make_checkpoint,
    restore_checkpoint,
    rng_state,
    set_rng_state,
    state_dicts,
)
from .clock import PhaseClock
from .evaluate import revisited_eval, run_eval, split_name
from .load import save_embeddings
from .resume import check_resume_config, plateaued

LOGGER = logging.getLogger(__name__)
LOG_FREQ = 10


def plain(value: Any) -> Any:
    """Deep copy with tuples as lists, so a config equals its YAML round trip."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


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


def load_run_config(config: dict | None, run_dir: Path) -> dict:
    """``config`` (else ``RUN_DIR/config.yaml``) as plain lists and dicts, validated."""
    saved_cfg = run_dir / "config.yaml"
    if config is None:
        if not saved_cfg.exists():
            raise run_folder.RunFolderError(f"{saved_cfg} not found: give a config")
        config = load_yaml(saved_cfg)
    config = plain(config)
    validate(config)
    return config


def _prepare(config: dict, run_dir: Path, resume: bool, overwrite: bool) -> bool:
    """Make the (locked) folder ready and save the config; returns whether the run resumes."""
    saved_cfg = run_dir / "config.yaml"
    resuming = resume and (run_dir / "checkpoints" / "latest.pt").exists()
    if resume and not resuming:
        LOGGER.warning("--resume: no checkpoint in %s; starting from scratch", run_dir)
    # A fresh run must not append to an older run's logs; --resume without a checkpoint has
    # nothing to keep.
    run_folder.prepare(run_dir, resume=resuming, overwrite=overwrite or resume)
    if resuming and saved_cfg.exists():
        check_resume_config(load_yaml(saved_cfg), config, saved_cfg)
    # Accepted: only now remove what a killed write of ours left (a refused run touches nothing).
    run_folder.remove_partial_writes(run_dir)
    with run_folder.disk_full_as_error(saved_cfg):
        dump_yaml(config, saved_cfg)
    return resuming


def train_run(
    config: dict,
    run_dir: str | Path,
    resume: bool = False,
    stop_after_epoch: int | None = None,
    device: str | None = None,
    overwrite: bool = False,
    on_epoch: Callable[[dict], bool] | None = None,
) -> dict:
    """Train one experiment into ``run_dir`` and return the ``metrics.json`` content.

    ``config``: a config as :func:`load_run_config` returns it. ``resume=True`` continues from
    ``checkpoints/latest.pt`` (only :data:`.resume.BUDGET_KEYS` may differ from the saved config,
    e.g. more epochs to extend a finished run). Without ``resume``, a folder that already holds a run is refused
    unless ``overwrite``. The folder is locked for the whole call (:func:`run_folder.lock`; under
    torchrun by rank 0, which alone writes files and evaluates). ``stop_after_epoch`` stops
    early as if interrupted (for tests and budgeted runs); the run can then be resumed. A
    non-finite loss or gradient raises :class:`.nonfinite.NonFiniteError`; any failure during
    training is recorded in ``metrics.json`` (``"status": "failed"``). ``on_epoch(row)`` is called
    with each epoch's history row once its checkpoint is written; returning True stops the run
    the same way (``pml-rank tune`` prunes trials with it; single-process runs only).
    """
    run_dir = Path(run_dir)
    # torchrun: one process per device; only rank 0 writes files and evaluates
    ctx = distributed.setup(device or config.get("device"))
    with contextlib.ExitStack() as stack:
        outcome: bool | Exception | None = None
        if ctx.is_main:
            try:
                stack.enter_context(run_folder.lock(run_dir))
                outcome = _prepare(config, run_dir, resume, overwrite)
            except Exception as e:  # every rank must raise it, not wait for rank 0
                outcome = e
        outcome = distributed.broadcast_object(outcome)
        if isinstance(outcome, Exception):
            raise outcome
        distributed.barrier()
        return _train(config, run_dir, bool(outcome), stop_after_epoch, ctx, on_epoch)


def _train(config, run_dir: Path, resuming: bool, stop_after_epoch, ctx, on_epoch=None) -> dict:
    t0 = time.perf_counter()
    clock = PhaseClock()  # where the time goes (metrics.json "phase_seconds")
    main = ctx.is_main
    ckpt_path = run_dir / "checkpoints" / "latest.pt"
    with clock.phase("setup"):
        exp = builder.build_experiment(config, ctx.device)
    ev = builder.eval_settings(config)
    val_entries = list(ev["validation"] or [])
    val_entries = [e for e in val_entries if split_name(e) in exp.datasets]
    primary = ev["primary_metric"]
    val_split = split_name(val_entries[0]) if val_entries else None

    history: list[dict] = []
    best = {"epoch": None, "value": None}
    start_epoch, stopped_early = 1, False
    if resuming:
        ckpt = distributed.broadcast_object(
            load_checkpoint(ckpt_path, required=LATEST_KEYS) if main else None
        )
        restore_checkpoint(exp, ckpt, ckpt_path)
        history, best = from_plain(ckpt["history"]), from_plain(ckpt["best"])
        # Re-judged with the (possibly changed) patience, so a longer patience continues it.
        stopped_early = plateaued(ev["patience"], best, ckpt["epoch"])
        start_epoch = exp.num_epochs + 1 if stopped_early else ckpt["epoch"] + 1
        LOGGER.info("resuming %s at epoch %d", run_dir, start_epoch)

    record_keeper = tb_writer = tester = hooks = None
    with clock.phase("setup"):
        keep = KeptEmbeddings()  # the final test's embeddings, for the pictures
        if main:
            record_keeper, tb_writer, hooks = make_logging(run_dir, primary, val_split, resuming)
            tester = builder.build_tester(config, exp.device, keep.hook(hooks.end_of_testing_hook))
        check = nonfinite.NonFiniteCheck(chained=hooks.end_of_iteration_hook if main else None)
        check.watch(exp.models["embedder"])  # the embeddings the losses get
        trainer = builder.make_trainer(exp, end_of_iteration_hook=check)

    epoch = start_epoch
    try:
        for epoch in range(start_epoch, exp.num_epochs + 1):
            t_epoch = time.perf_counter()
            if hasattr(exp.sampler, "set_epoch"):
                exp.sampler.set_epoch(epoch)
            check.start_epoch()
            try:
                with clock.phase("train"):
                    trainer.train(start_epoch=epoch, num_epochs=epoch)
            except nonfinite.NonFiniteError:
                raise
            except Exception as e:  # a loss refusing non-finite embeddings: say where
                check.explain(e, trainer)
                raise
            # before validation and any checkpoint: a non-finite model is never saved
            nonfinite.check_weights({**exp.models, **exp.loss_funcs}, epoch)
            row: dict[str, Any] = {"epoch": epoch, "train_loss": check.mean_loss()}
            if val_entries and (epoch % int(ev["test_interval"]) == 0 or epoch == exp.num_epochs):
                with clock.phase("validation"):
                    row["validation"] = distributed.broadcast_object(
                        run_eval(tester, exp, val_entries, epoch) if main else None
                    )
                distributed.sync_rng_state(rng_state, set_rng_state)
                value = row["validation"][val_split].get(primary)
                trainer.step_lr_plateau_schedulers(value)
                if value is not None and (best["value"] is None or value > best["value"]):
                    best = {"epoch": epoch, "value": value}
                    if main:
                        with clock.phase("checkpoints"):
                            atomic_torch_save(
                                {"epoch": epoch, "models": state_dicts(exp.models)},
                                run_dir / "checkpoints" / "best.pt",
                            )
            history.append(row)
            if record_keeper is not None:
                record_keeper.save_records()
            if plateaued(ev["patience"], best, epoch):
                LOGGER.info(
                    "validation %s plateaued for %s epochs; stopping", primary, ev["patience"]
                )
                stopped_early = True
            if main:
                with clock.phase("checkpoints"):
                    ckpt = make_checkpoint(exp, epoch, history, best)
                    ckpt["stopped_early"] = stopped_early
                    atomic_torch_save(ckpt, ckpt_path)
                LOGGER.info(epoch_line(row, exp.num_epochs, val_split, primary, best, t_epoch))
            if stopped_early:
                break
            stop = stop_after_epoch is not None and stop_after_epoch <= epoch
            if on_epoch is not None and on_epoch(row):
                stop = True
            if stop and epoch < exp.num_epochs:
                distributed.barrier()
                return {"interrupted_after_epoch": epoch, "history": history, "best": best}
        timing = (t0, clock, keep)
        return _finish(config, run_dir, exp, tester, history, best, stopped_early, ctx, timing)
    except Exception as e:
        if main:
            _record_failure(config, run_dir, exp, history, best, e, epoch)
        raise
    finally:
        if record_keeper is not None:
            record_keeper.save_records()
        if tb_writer is not None:
            tb_writer.close()


def epoch_line(row: dict, num_epochs: int, val_split, primary: str, best: dict, t0: float) -> str:
    """``epoch 3/6  loss 0.4213  val MAP 0.5534 (best 0.5534 @ 3)  12.3 s`` (one per epoch)."""
    parts = [f"epoch {row['epoch']}/{num_epochs}"]
    if row.get("train_loss") is not None:
        parts.append(f"loss {row['train_loss']:.4f}")
    value = (row.get("validation") or {}).get(val_split, {}).get(primary)
    if value is not None:
        parts.append(
            f"{val_split} {primary} {value:.4f} (best {best['value']:.4f} @ {best['epoch']})"
        )
    parts.append(f"{time.perf_counter() - t0:.1f} s")
    return "  ".join(parts)


def _finish(config, run_dir, exp, tester, history, best, stopped_early, ctx, timing) -> dict:
    """Final test with the best validation epoch's weights (the last epoch's without validation).
    ``timing``: ``(t0, PhaseClock, KeptEmbeddings)`` of the run."""
    t0, clock, keep = timing
    main = ctx.is_main
    ev = builder.eval_settings(config)
    val_entries = [e for e in list(ev["validation"] or []) if split_name(e) in exp.datasets]
    test_entries = list(ev["test"] or [])
    if best["epoch"] is not None and main:
        load_models(exp.models, run_dir / "checkpoints" / "best.pt")
    final_epoch = best["epoch"] if best["epoch"] is not None else history[-1]["epoch"]
    with clock.phase("test"):
        keep.active = True
        test = run_eval(tester, exp, test_entries, final_epoch) if test_entries and main else {}
        keep.active = False
        if test_entries and main:  # the pictures reuse them instead of embedding again
            ckpt = "best.pt" if best["epoch"] is not None else "latest.pt"
            save_test_embeddings(run_dir, keep.data, ckpt)
        if main:  # eval.revisited test sets (Revisited Oxford / Paris)
            test = {**test, **revisited_eval(config, exp.models, tester)}
    test = distributed.broadcast_object(test)
    if not test and val_entries and best["epoch"] is not None:
        test = next(h["validation"] for h in history if h["epoch"] == best["epoch"])
    metrics = {
        "name": config.get("name", run_dir.name),
        "status": "finished",
        "seed": exp.seed,
        "epochs_run": history[-1]["epoch"] if history else 0,
        "stopped_early": stopped_early,
        "best": best,
        "history": history,
        "test": test,
        "train_seconds_this_call": time.perf_counter() - t0,
        "phase_seconds": clock.as_dict(),  # this call's (running/clock.py)
        "run_info": distributed.run_info(ctx, exp.extra.get("amp")),
    }
    if main:
        run_folder.write_text(run_dir / "metrics.json", json.dumps(metrics, indent=2))
    distributed.barrier()
    return metrics


class KeptEmbeddings:
    """Keeps the embeddings of the test that runs while ``active`` (PML's tester deletes its
    ``embeddings_and_labels`` when ``test`` returns; its end-of-testing hook still sees them)."""

    def __init__(self) -> None:
        self.active = False
        self.data: dict = {}

    def hook(self, chained):
        def end_of_testing(tester) -> None:
            if self.active:
                self.data = dict(tester.embeddings_and_labels)
            if chained is not None:
                chained(tester)

        return end_of_testing


def save_test_embeddings(run_dir: Path, embeddings: dict, checkpoint: str) -> None:
    """``RUN_DIR/embeddings/<split>.npz`` for each split the final test embedded (``{split:
    (embeddings, labels)}``), tagged with the checkpoint they came from. A bonus for
    ``compare``'s pictures (:func:`pml_rank_plugins.reporting.retrieval.saved_embeddings`): a
    failure to write them is logged, never fails the run. O(N D) per split."""
    try:
        (run_dir / "embeddings").mkdir(exist_ok=True)
        for split, (emb, labels) in embeddings.items():
            save_embeddings(
                run_dir / "embeddings" / f"{split}.npz",
                emb.float().cpu().numpy(),
                labels.cpu().numpy(),
                split=split,
                checkpoint=checkpoint,
            )
    except (OSError, run_folder.RunFolderError, ValueError, TypeError) as e:
        LOGGER.warning("%s: test embeddings not saved (%s); pictures embed again", run_dir, e)


def _record_failure(config, run_dir: Path, exp, history, best, error: Exception, epoch: int):
    """``metrics.json`` with ``"status": "failed"`` and the error (the last good checkpoint stays)."""
    metrics = {
        "name": config.get("name", run_dir.name),
        "status": "failed",
        "error": f"{type(error).__name__}: {error}",
        "failed_in_epoch": epoch,
        "seed": exp.seed,
        "epochs_run": history[-1]["epoch"] if history else 0,
        "best": best,
        "history": history,
        "test": {},
    }
    try:
        run_folder.write_text(run_dir / "metrics.json", json.dumps(metrics, indent=2))
    except (OSError, run_folder.DiskFullError) as e:  # the original error is the one to raise
        LOGGER.error("%s: cannot record the failure in metrics.json: %s", run_dir, e)
    LOGGER.error("%s: training failed in epoch %d: %s", run_dir, epoch, metrics["error"])
