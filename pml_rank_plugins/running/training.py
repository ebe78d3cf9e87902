"""Train one run (one config, one folder) with PML's trainer, tester and logging presets.

Run directory layout::

    RUN_DIR/config.yaml              the resolved config (what ``eval`` and ``--resume`` rebuild)
    RUN_DIR/checkpoints/latest.pt    written atomically after every epoch (models, optimizers,
                                     schedulers, loss/miner state, RNG states, history)
    RUN_DIR/checkpoints/best.pt      model weights of the best validation epoch
    RUN_DIR/logs/                    record-keeper CSV files + logs.db (SQLite)
    RUN_DIR/tensorboard/             tensorboard events
    RUN_DIR/metrics.json             validation history, best epoch, test metrics (and, with
                                     trainer.compile, the compile time: running/compiled.py)

Each epoch is one call to PML's ``trainer.train(start_epoch=e, num_epochs=e)`` preceded by
``sampler.set_epoch(e)``, so an epoch's batches depend only on the checkpointed state: a run
interrupted after epoch e and resumed reaches bit-identical weights to an uninterrupted one.
The loop is :class:`EpochLoop`, one method per step (train an epoch, validate, update the best,
end the epoch, save, stop, finish); what it checkpoints besides the tensors is a
:class:`.run_state.RunState`, what it writes as ``metrics.json`` one :class:`.run_state.RunResult`.
MLRC configs (one run per fold) are dispatched by :func:`pml_rank_plugins.running.runner.train`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from pytorch_metric_learning.utils import logging_presets

from ..experiment import builder
from ..experiment.schema import dump_yaml
from ..experiment.spec import RunSpec, read_run_config, split_name
from . import distributed, nonfinite, run_folder
from .checkpoints import (
    LATEST_KEYS,
    atomic_torch_save,
    load_checkpoint,
    load_models,
    restore_checkpoint,
    rng_state,
    set_rng_state,
    state_dicts,
)
from .clock import PhaseClock
from .compiled import CompileMeter, compile_experiment
from .evaluate import revisited_eval, run_eval
from .load import save_embeddings
from .resume import check_resume_config, plateaued
from .run_state import RunResult, RunState, record_failure

LOGGER = logging.getLogger(__name__)
LOG_FREQ = 10


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


def load_run_config(config: RunSpec | Mapping | None, run_dir: Path) -> RunSpec:
    """The spec of ``config`` (parsed when it is no spec yet), else of ``RUN_DIR/config.yaml``."""
    if config is not None:
        return RunSpec.of(config)
    if not (Path(run_dir) / "config.yaml").exists():
        raise run_folder.RunFolderError(f"{Path(run_dir) / 'config.yaml'} not found: give a config")
    return RunSpec.load(run_dir)


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
        check_resume_config(read_run_config(run_dir), config, saved_cfg)
    # Accepted: only now remove what a killed write of ours left (a refused run touches nothing).
    run_folder.remove_partial_writes(run_dir)
    with run_folder.disk_full_as_error(saved_cfg):
        dump_yaml(config, saved_cfg)
    return resuming


def train_run(
    spec: RunSpec,
    run_dir: str | Path,
    resume: bool = False,
    stop_after_epoch: int | None = None,
    device: str | None = None,
    overwrite: bool = False,
    on_epoch: Callable[[dict], bool] | None = None,
) -> dict:
    """Train one experiment into ``run_dir`` and return the ``metrics.json`` content.

    ``spec``: the run's :class:`~pml_rank_plugins.experiment.RunSpec`. ``resume=True`` continues from
    ``checkpoints/latest.pt`` (only ``resume.BUDGET_KEYS`` may differ from the saved config,
    e.g. more epochs to extend a finished run). Without ``resume``, a folder that already holds a run is refused
    unless ``overwrite``. The folder is locked for the whole call (``run_folder.lock``; under
    torchrun by rank 0, which alone writes files and evaluates). ``stop_after_epoch`` stops
    early as if interrupted (for tests and budgeted runs); the run can then be resumed. A
    non-finite loss or gradient raises :class:`.nonfinite.NonFiniteError`; any failure during
    training is recorded in ``metrics.json`` (``"status": "failed"``). ``on_epoch(row)`` is called
    with each epoch's history row once its checkpoint is written; returning True stops the run
    the same way (``pml-rank tune`` prunes trials with it; single-process runs only).
    """
    run_dir = Path(run_dir)
    # torchrun: one process per device; only rank 0 writes files and evaluates
    ctx = distributed.setup(spec.device_for(device))
    with contextlib.ExitStack() as stack:
        outcome: bool | Exception | None = None
        if ctx.is_main:
            try:
                stack.enter_context(run_folder.lock(run_dir))
                outcome = _prepare(spec.config, run_dir, resume, overwrite)
            except Exception as e:  # every rank must raise it, not wait for rank 0
                outcome = e
        outcome = distributed.broadcast_object(outcome)
        if isinstance(outcome, Exception):
            raise outcome
        distributed.barrier()
        return _train(spec, run_dir, bool(outcome), stop_after_epoch, ctx, on_epoch)


def _train(spec, run_dir: Path, resuming: bool, stop_after_epoch, ctx, on_epoch=None) -> dict:
    return EpochLoop(spec, run_dir, ctx, resuming, stop_after_epoch, on_epoch).run()


class EpochLoop:
    """The epoch loop of one run, one named step per concern (as PML's ``BaseTrainer``):
    :meth:`train_epoch`, :meth:`validate` (which calls :meth:`update_best`), :meth:`end_epoch`
    (history, plateau, :meth:`save`), :meth:`should_stop` and, after the last epoch,
    :meth:`finish` (the final test, :meth:`final_test`). What a checkpoint restores is
    :attr:`state` (:class:`.run_state.RunState`); the outcome is one
    :class:`.run_state.RunResult`. ``ctx``: :func:`.distributed.setup`'s context (rank 0 alone
    writes files and evaluates)."""

    def __init__(
        self,
        spec: RunSpec,
        run_dir: Path,
        ctx,
        resuming: bool,
        stop_after_epoch=None,
        on_epoch: Callable[[dict], bool] | None = None,
    ) -> None:
        self.spec, self.run_dir, self.ctx, self.main = spec, run_dir, ctx, ctx.is_main
        self.stop_after_epoch, self.on_epoch, self.resuming = stop_after_epoch, on_epoch, resuming
        self.t0, self.t_epoch = time.perf_counter(), 0.0
        self.clock = PhaseClock()  # where the time goes (metrics.json "phase_seconds")
        self.keep = KeptEmbeddings()  # the final test's embeddings, for the pictures
        self.ckpt_path = run_dir / "checkpoints" / "latest.pt"
        self.record_keeper = self.tb_writer = self.tester = self.hooks = None
        with self.clock.phase("setup"):
            self.exp = builder.build_experiment(spec, ctx.device)
        self.val_entries = self.exp.eval_entries("validation")
        self.primary = spec.eval.primary_metric
        self.val_split = split_name(self.val_entries[0]) if self.val_entries else None
        self.state = self.resume() if resuming else RunState()
        self.setup(resuming)

    def resume(self) -> RunState:
        """Restore ``latest.pt`` into the experiment; its :class:`RunState`."""
        ckpt = distributed.broadcast_object(
            load_checkpoint(self.ckpt_path, required=LATEST_KEYS) if self.main else None
        )
        restore_checkpoint(self.exp, ckpt, self.ckpt_path)
        return RunState.restore(ckpt, self.spec.eval.patience)

    def setup(self, resuming: bool) -> None:
        """Logging (rank 0), tester, the non-finite check and the PML trainer."""
        with self.clock.phase("setup"):
            if self.main:
                self.record_keeper, self.tb_writer, self.hooks = make_logging(
                    self.run_dir, self.primary, self.val_split, resuming
                )
                hook = self.keep.hook(self.hooks.end_of_testing_hook)
                self.tester = builder.build_tester(self.spec, self.exp.device, hook)
            chained = self.hooks.end_of_iteration_hook if self.main else None
            self.check = nonfinite.NonFiniteCheck(chained=chained)
            self.check.watch(self.exp.models["embedder"])  # the embeddings the losses get
            self.check.watch_losses(self.exp.loss_funcs, self.exp.mining_funcs)  # to replay
            # trainer.compile: models and losses compiled in place (lazily, at their first call)
            self.compile = CompileMeter(self.exp.extra.get("compile"), compile_experiment(self.exp))
            self.trainer = builder.make_trainer(self.exp, end_of_iteration_hook=self.check)

    def first_epoch(self) -> int:
        """1, the epoch after the checkpoint's, or past the end for a run stopped early."""
        if self.state.stopped_early:
            return self.exp.num_epochs + 1
        return self.state.epoch + 1

    def run(self) -> dict:
        """Train the remaining epochs, then :meth:`finish`; returns the ``metrics.json``
        content, or the interrupted record when :meth:`should_stop` stopped it early."""
        start = epoch = self.first_epoch()
        if self.resuming:
            LOGGER.info("resuming %s at epoch %d", self.run_dir, start)
        try:
            for epoch in range(start, self.exp.num_epochs + 1):
                row = self.train_epoch(epoch)
                self.validate(epoch, row)
                self.end_epoch(row)
                if self.state.stopped_early:
                    break
                if self.should_stop(row) and epoch < self.exp.num_epochs:
                    distributed.barrier()
                    return self.result("interrupted").as_dict()
            return self.finish()
        except Exception as e:
            if self.main:
                record_failure(
                    RunResult.failed(*self.identity(), self.state, e, epoch), self.run_dir
                )
            raise
        finally:
            self.close()

    def train_epoch(self, epoch: int) -> dict[str, Any]:
        """One PML ``trainer.train`` epoch; its history row (``epoch``, ``train_loss``). The
        weights are checked before any validation or checkpoint: a non-finite model is never
        saved."""
        self.t_epoch = time.perf_counter()
        if hasattr(self.exp.sampler, "set_epoch"):
            self.exp.sampler.set_epoch(epoch)
        self.check.start_epoch()
        try:
            with self.clock.phase("train"):
                self.trainer.train(start_epoch=epoch, num_epochs=epoch)
        except nonfinite.NonFiniteError:
            raise
        except Exception as e:  # a loss refusing non-finite embeddings: say where
            self.check.explain(e, self.trainer)
            raise
        nonfinite.check_weights({**self.exp.models, **self.exp.loss_funcs}, epoch)
        return {"epoch": epoch, "train_loss": self.check.mean_loss()}

    def validate(self, epoch: int, row: dict) -> None:
        """Every ``eval.test_interval`` epochs and at the last: the validation splits into
        ``row``, the plateau schedulers stepped with the primary metric, the best updated."""
        interval = self.spec.eval.test_interval
        if not self.val_entries or (epoch % interval and epoch != self.exp.num_epochs):
            return
        with self.clock.phase("validation"):
            row["validation"] = distributed.broadcast_object(
                run_eval(self.tester, self.exp, self.val_entries, epoch) if self.main else None
            )
        distributed.sync_rng_state(rng_state, set_rng_state)
        value = row["validation"][self.val_split].get(self.primary)
        self.trainer.step_lr_plateau_schedulers(value)
        self.update_best(epoch, value)

    def update_best(self, epoch: int, value: float | None) -> None:
        """A better ``value``: remembered, and the weights saved as ``best.pt`` (rank 0)."""
        if not self.state.improves(value):
            return
        self.state.best = {"epoch": epoch, "value": value}
        if self.main:
            with self.clock.phase("checkpoints"):
                atomic_torch_save(
                    {"epoch": epoch, "models": state_dicts(self.exp.models)},
                    self.run_dir / "checkpoints" / "best.pt",
                )

    def end_epoch(self, row: dict) -> None:
        """The row into the history, the record keeper's files, the plateau rule, then
        :meth:`save`."""
        state = self.state
        state.history.append(row)
        state.epoch = row["epoch"]
        if self.record_keeper is not None:
            self.record_keeper.save_records()
        patience = self.spec.eval.patience
        if plateaued(patience, state.best, state.epoch):
            LOGGER.info("validation %s plateaued for %s epochs; stopping", self.primary, patience)
            state.stopped_early = True
        self.save(row)

    def save(self, row: dict) -> None:
        """``latest.pt`` (rank 0, atomically) and the epoch's log line."""
        if not self.main:
            return
        with self.clock.phase("checkpoints"):
            atomic_torch_save(self.state.checkpoint(self.exp), self.ckpt_path)
        num = self.exp.num_epochs
        LOGGER.info(
            epoch_line(row, num, self.val_split, self.primary, self.state.best, self.t_epoch)
        )
        compiling = self.compile.new_since_last()  # the epoch's compile time, when it had any
        if compiling is not None:
            LOGGER.info(compiling)

    def should_stop(self, row: dict) -> bool:
        """``stop_after_epoch`` reached, or ``on_epoch(row)`` (a pruner) says stop."""
        stop = self.stop_after_epoch is not None and self.stop_after_epoch <= row["epoch"]
        if self.on_epoch is not None and self.on_epoch(row):
            stop = True
        return stop

    def finish(self) -> dict:
        """Final test with the best validation epoch's weights (the last epoch's without
        validation); writes and returns ``metrics.json``."""
        best = self.state.best
        if best["epoch"] is not None and self.main:
            load_models(self.exp.models, self.run_dir / "checkpoints" / "best.pt")
        test = self.final_test(
            best["epoch"] if best["epoch"] is not None else self.state.epochs_run
        )
        if not test and self.val_entries and best["epoch"] is not None:
            test = self.state.best_validation()
        result = self.result("finished", test)
        if self.main:
            result.write(self.run_dir)
        distributed.barrier()
        return result.as_dict()

    def final_test(self, epoch: int) -> dict:
        """The ``eval.test`` splits (their embeddings kept for the pictures) and the
        ``eval.revisited`` test sets, on rank 0; every rank gets the result."""
        entries, main = self.spec.eval.entries(["test"]), self.main
        with self.clock.phase("test"):
            self.keep.active = True
            test = run_eval(self.tester, self.exp, entries, epoch) if entries and main else {}
            self.keep.active = False
            if entries and main:  # the pictures reuse them instead of embedding again
                ckpt = "best.pt" if self.state.best["epoch"] is not None else "latest.pt"
                save_test_embeddings(self.run_dir, self.keep.data, ckpt)
            if main:  # eval.revisited test sets (Revisited Oxford / Paris)
                test = {**test, **revisited_eval(self.spec.config, self.exp.models, self.tester)}
        return distributed.broadcast_object(test)

    def identity(self) -> tuple[str, int]:
        """``(name, seed)`` as ``metrics.json`` records them."""
        return self.spec.get("name", self.run_dir.name), self.exp.seed

    def result(self, status: str, test: dict | None = None) -> RunResult:
        name, seed = self.identity()
        timing = {
            "train_seconds_this_call": time.perf_counter() - self.t0,
            "phase_seconds": self.clock.as_dict(),  # this call's (running/clock.py)
        }
        if self.compile.settings is not None:  # trainer.compile: this call's compile time
            timing["compile"] = self.compile.record()
        info = distributed.run_info(self.ctx, self.exp.extra.get("amp"))
        return RunResult(name, seed, self.state, status, test or {}, timing=timing, run_info=info)

    def close(self) -> None:
        if self.record_keeper is not None:
            self.record_keeper.save_records()
        if self.tb_writer is not None:
            self.tb_writer.close()


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
    ``compare``'s pictures (``reporting.retrieval.saved_embeddings``): a
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
