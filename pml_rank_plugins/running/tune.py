"""``pml-rank tune``: every method tuned with the same budget on one Optuna study each.

MLRC's fair comparison (Musgrave et al., ECCV 2020): same trunk, same training budget, and every
loss tuned by the same optimizer on validation data before its test numbers are reported. Here
each method of a config gets one Optuna study (named after the method) with ``trials`` trials
drawn from its ``tune.space`` (:mod:`pml_rank_plugins.experiment.search_space`). A trial is an
ordinary run folder ``OUT/<method>/trial<k>/`` trained by :func:`.runner.train`, so locks,
non-finite stops and MLRC folds behave as in ``pml-rank train``. The objective is the validation
primary metric at the best epoch (for MLRC, the mean over the folds, as MLRC did); the test
splits are removed from a trial's config, so tuning never looks at them.

Pruning: after each validated epoch (``on_epoch`` of :func:`.runner.train`) the value goes to
the pruner; a pruned trial stops training after that epoch's checkpoint (state PRUNED; its
folder keeps the epochs it ran). MLRC configs are not pruned (their per-epoch value is per fold).

Budget: each study records, in its attributes and in ``tune.json``, the complete effective config
its trials are built from (after ``--set``; ``data_root`` apart) and its hash
(:mod:`pml_rank_plugins.experiment.tuned`); continuing a study with a different config is refused,
naming the keys, and ``compare --tuned`` trains at exactly that budget.

Storage: ``sqlite:///OUT/tune.db`` by default, or any URL Optuna accepts (``postgresql://...``),
so several processes (``--jobs K``) and machines share a study; in-memory SQLite is refused (the
workers' trials would be lost). Trial numbers come from the
storage, so a trial folder is never reused. Asking for a trial holds a lock (a file lock in
``OUT``; with PostgreSQL also an advisory lock in the database), so the study never gets more than
``trials`` trials. Rerunning the same command continues: finished trials are kept, a trial left
RUNNING by a killed process on this machine is marked FAIL (its run folder's lock is free) and
does not count toward ``trials``; when its folder holds a checkpoint, a new trial with the same
parameters continues that folder where it stopped (:mod:`.trial_resume`: nothing trained twice,
nothing lost), and new trials are added until the study holds ``trials`` that count. A trial
counts as interrupted only when the process that asked for it (``pid`` attribute, this machine)
is gone; its run folder is then marked FAIL. A failing trial (exception, non-finite loss) is recorded FAIL in the study and in its
folder, and the study goes on. Workers die with the ``tune`` process (:mod:`.parent`), and no more
workers start than trials are left.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import logging
import multiprocessing as mp
import os
import socket
import time
from pathlib import Path
from typing import Any, Mapping

import optuna
import sqlalchemy
import torch
from optuna.trial import TrialState

from ..experiment import registry, search_space
from ..experiment.methods import slug
from ..experiment.schema import ConfigError
from ..experiment.search_space import (
    check_tune_config,
    suggest,
    tune_section,
)
from ..experiment.spec import EvalSettings, RunSpec
from . import distributed, run_folder, runner
from .console import child_environment
from .parent import exit_with_parent, pid_alive
from .run_folder import StorageError
from .study import (  # noqa: F401 -- re-exported: tune's public names
    ASK_LOCK,
    DEFAULT_PRIMARY,
    INTERRUPTED_PREFIX,
    TuneJob,
    ask_lock,
    bind_budget,
    counted_trials,
    default_storage,
    is_interrupted,
    make_storage,
    open_study,
    public_url,
    refuse_in_memory,
    study_summary,
)
from .trial_resume import continued_trial, replay_reports, requeue_interrupted

LOGGER = logging.getLogger(__name__)


def trial_folder(job: TuneJob, number: int) -> Path:
    """``OUT/<method>/trial<k>``, absolute and resolved (the trial attribute ``run_dir``)."""
    return job.out_dir.resolve() / slug(job.method) / f"trial{number}"


def fail_interrupted_trials(study: optuna.Study, job: TuneJob) -> list[int]:
    """Mark FAIL (with a warning) every RUNNING trial of this machine whose owner process is gone
    and whose run folder is not locked; returns their numbers. Call it under :func:`ask_lock`:
    a trial in the middle of :func:`_ask` has no ``pid`` yet. Trials of other machines are left
    to their owners; a ``run_dir`` outside ``--out`` (a tampered storage) is refused."""
    failed = []
    out = job.out_dir.resolve()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        run_dir = t.user_attrs.get("run_dir")
        if t.user_attrs.get("host") != socket.gethostname() or not run_dir:
            continue
        pid = t.user_attrs.get("pid")
        if isinstance(pid, int) and not isinstance(pid, bool) and pid_alive(pid):
            continue  # its owner still runs (from any working directory)
        path = Path(run_dir)
        if not path.is_absolute() or not path.resolve().is_relative_to(out):
            raise StorageError(
                f"[{job.method}] trial {t.number}: run_dir {run_dir!r} is not inside --out "
                f"{out}; refusing to touch it (was the storage edited?)"
            )
        if path.exists():
            try:
                with run_folder.lock(path):
                    pass
            except run_folder.RunFolderBusy:
                continue  # a live process trains it
        # recorded as interrupted, so the trial does not count toward --trials (is_interrupted)
        study._storage.set_trial_user_attr(  # noqa: SLF001
            t._trial_id, "error", f"{INTERRUPTED_PREFIX}: its process {pid} is gone"  # noqa: SLF001
        )
        study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)  # noqa: SLF001
        LOGGER.warning("[%s] trial %d was interrupted; marked failed", job.method, t.number)
        failed.append(t.number)
    return failed


def trial_config(job: TuneJob, params: Mapping[str, Any], number: int) -> dict:
    """The run config of trial ``number``, named ``<method> trial<k>``
    (:func:`pml_rank_plugins.experiment.search_space.trial_config`)."""
    return search_space.trial_config(job.config, params, f"{job.method} trial{number}")


def train_trial(
    trial: optuna.Trial, config: dict, run_dir: Path, device: str | None, resume: bool = False
) -> float:
    """Train one trial (``resume``: continue ``run_dir`` from its checkpoint, for a trial that
    continues an interrupted one); report each validated epoch to the pruner (and a progress
    line). Returns
    the objective; raises :class:`optuna.TrialPruned` when the pruner stopped it (after that
    epoch's checkpoint), and ``UpdateFinishedTrialError`` when another command finished the
    trial (the run stops after that epoch's checkpoint, as a killed one; no failure record)."""
    epochs = _num_epochs(config)
    finished: list[optuna.exceptions.UpdateFinishedTrialError] = []

    def report(row: dict) -> bool:
        value = _row_value(config, row) if row.get("validation") else None
        if value is None:
            return False
        LOGGER.info(
            "[%s] epoch %s/%s: validation %.4f", config.get("name"), row["epoch"], epochs, value
        )
        try:
            trial.report(value, row["epoch"])
        except optuna.exceptions.UpdateFinishedTrialError as e:
            finished.append(e)  # raised below, not inside the run (it would record a failure)
            return True
        return trial.should_prune()

    spec = RunSpec.of(config)  # a trial's config is new: validated once, here
    on_epoch = None if spec.protocol.is_mlrc else report  # MLRC's epochs are per fold: not pruned
    m = runner.train(spec, run_dir, resume=resume, device=device, on_epoch=on_epoch)
    if finished:
        raise finished[0]
    if "interrupted_after_epoch" in m:
        raise optuna.TrialPruned(f"pruned after epoch {m['interrupted_after_epoch']}")
    value = (m.get("best") or {}).get("value")
    if value is None:
        raise ValueError(f"{run_dir}: no validation value (is eval.validation set?)")
    return float(value)


def _num_epochs(config: Mapping) -> Any:
    trainer = config.get("trainer") or {}
    kwargs = next(iter(trainer.values()), None) if isinstance(trainer, Mapping) else None
    return kwargs.get("num_epochs", "?") if isinstance(kwargs, Mapping) else "?"


def _row_value(config: Mapping, row: dict) -> float | None:
    primary = EvalSettings.parse(config).primary_metric
    first = next(iter(row["validation"].values()), {})
    value = first.get(primary)
    return None if value is None else float(value)


def _ask(
    job: TuneJob, study: optuna.Study
) -> tuple[optuna.Trial, Path, optuna.trial.FrozenTrial | None] | None:
    """Under the ask lock: a new trial with its absolute run folder and owner recorded, and the
    interrupted trial it continues (None for a fresh one); None when the study holds
    ``job.trials`` trials that count (interrupted ones do not: :func:`~.study.counted_trials`)."""
    with ask_lock(job):
        if counted_trials(study) >= job.trials:
            return None
        trial = study.ask()
        interrupted = continued_trial(study, trial)
        if interrupted is None:
            run_dir = trial_folder(job, trial.number)
        else:  # continues the interrupted trial's folder (trial_resume)
            run_dir = Path(interrupted.user_attrs["run_dir"])
        if not run_folder.inside(job.out_dir, run_dir):  # a method folder linked elsewhere
            raise run_folder.UnsafeRunFolder(f"{run_dir}: resolves outside --out {job.out_dir}")
        trial.set_user_attr("run_dir", str(run_dir))
        trial.set_user_attr("host", socket.gethostname())
        trial.set_user_attr("pid", os.getpid())
        return trial, run_dir, interrupted


def run_trials(job: TuneJob, worker: int = 0) -> int:
    """Add trials to the method's study until it holds ``job.trials``; returns how many this
    process ran. Failures are recorded, never raised; a trial that another command marked
    finished stops this worker with one line."""
    with ask_lock(job):
        study = open_study(job, worker)
    space = check_tune_config(job.config, job.method)
    ran = 0
    while True:
        asked = _ask(job, study)
        if asked is None:
            return ran
        trial, run_dir, interrupted = asked
        try:
            exhausted = _run_one(job, study, trial, space, run_dir, interrupted)
        except optuna.exceptions.UpdateFinishedTrialError as e:
            LOGGER.error(
                "[%s] trial %d was finished by another command (%s); this worker stops",
                job.method,
                trial.number,
                e,
            )
            return ran
        ran += 1
        if exhausted:
            LOGGER.info("[%s] the sampler's space is exhausted; no further trial", job.method)
            return ran


def _run_one(
    job: TuneJob,
    study: optuna.Study,
    trial: optuna.Trial,
    space: Mapping,
    run_dir: Path,
    interrupted: optuna.trial.FrozenTrial | None = None,
) -> bool:
    """Train and tell one trial (``interrupted``: the trial it continues, from :func:`_ask`);
    True when the sampler's space is exhausted."""
    params = {p.path: suggest(trial, p) for p in space.values()}
    if interrupted is not None:  # the interrupted run's own config (its name), then its curve
        replay_reports(trial, interrupted)
    config = trial_config(job, params, trial.number if interrupted is None else interrupted.number)
    t0 = time.perf_counter()
    value, state, error = None, TrialState.COMPLETE, None
    try:
        value = train_trial(trial, config, run_dir, job.device, resume=interrupted is not None)
    except optuna.TrialPruned:
        state = TrialState.PRUNED
    except optuna.exceptions.UpdateFinishedTrialError:
        raise
    except Exception as e:  # noqa: BLE001 -- one failing trial must not stop the study
        state, error = TrialState.FAIL, f"{type(e).__name__}: {e}"
        LOGGER.error("[%s] trial %d failed: %s", job.method, trial.number, error)
        trial.set_user_attr("error", error[:2000])
    trial.set_user_attr("wall_seconds", time.perf_counter() - t0)
    exhausted = False
    try:
        study.tell(trial, value, state=state)
    except RuntimeError as e:
        # Grid/BruteForce samplers call study.stop() once their space is exhausted; the
        # trial is recorded all the same (Optuna saves its state in a ``finally``).
        if "Study.stop" not in str(e):
            raise optuna.exceptions.UpdateFinishedTrialError(str(e)) from e
        exhausted = True
    except ValueError as e:  # "Cannot tell a FAIL trial": another command finished it
        raise optuna.exceptions.UpdateFinishedTrialError(str(e)) from e
    LOGGER.info(trial_line(job.method, study, trial.number, value, state.name.lower()))
    return exhausted


def trial_line(method: str, study: optuna.Study, number: int, value, state: str) -> str:
    """``[plugin FastAP] trial 3: 0.5123 (complete); best 0.5300 (trial 1)``."""
    shown = f"{value:.4f}" if value is not None else "-"
    try:
        best = study.best_trial
        best_text = f"best {best.value:.4f} (trial {best.number})"
    except ValueError:
        best_text = "no complete trial yet"
    return f"[{method}] trial {number}: {shown} ({state}); {best_text}"


def _worker_init(parent_pid: int) -> None:
    exit_with_parent(parent_pid)


def _worker(job: TuneJob, worker: int, num_threads: int, registered: dict) -> int:
    torch.set_num_threads(num_threads)
    for name, obj in registered.items():
        registry.register(name, obj, override=True)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # one line per epoch and trial (this module's): PML's per-run key warnings and the runner's
    # own per-epoch lines stay quiet
    logging.getLogger("PML").setLevel(logging.ERROR)
    logging.getLogger("pml_rank_plugins.running.training").setLevel(logging.WARNING)
    return run_trials(job, worker)


def tune(
    configs: Mapping[str, dict],
    out_dir: str | Path,
    trials: int | None = None,
    storage: str | None = None,
    jobs: int = 1,
    device: str | None = None,
) -> tuple[dict, dict]:
    """Tune every method of ``configs`` (``{method: config}``).

    ``trials`` overrides each config's ``tune.trials`` (every method gets the same number either
    way when they come from one config). ``jobs`` worker processes (at most the trials left) work
    on each study in turn. Returns ``({"storage", "methods": {method: study_summary}}, {method:
    optuna.Study})``; the files are written by
    :func:`pml_rank_plugins.reporting.tune_report.run_tune`.
    """
    if distributed.launched_by_torchrun():
        raise ConfigError(
            "tune runs its own worker processes (--jobs); do not start it with torchrun"
        )
    for flag, value in (("--jobs", jobs), ("--trials", trials)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ConfigError(f"{flag} must be an integer >= 1, got {value!r}")
    out_dir = Path(out_dir)
    url = storage or default_storage(out_dir)
    refuse_in_memory(url)  # before any trial trains
    budgets = {}
    for method, cfg in configs.items():
        check_tune_config(cfg, method)
        budgets[method] = int(trials or tune_section(cfg)["trials"])
    out_dir.mkdir(parents=True, exist_ok=True)
    results, studies = {}, {}
    for method, cfg in configs.items():
        job = TuneJob(method, copy.deepcopy(cfg), budgets[method], url, out_dir, device)
        study, digest = _open_and_recover(job)
        t0 = time.perf_counter()
        left = job.trials - counted_trials(study)
        if left > 0:
            _run_workers(job, min(jobs, left))
        # reloaded: the workers added the trials through their own connections
        studies[method] = open_study(job)
        results[method] = study_summary(studies[method], time.perf_counter() - t0, cfg)
        results[method].update(config=job.budget[0], config_hash=digest, data_root=job.budget[1])
    return {"storage": public_url(url), "methods": results}, studies


def _open_and_recover(job: TuneJob) -> tuple[optuna.Study, str]:
    """Under the ask lock (the storage is created once; every trial asked has its owner): the
    study, bound to the job's budget (its config hash returned), its interrupted trials marked
    failed and continued where they have a checkpoint."""
    with ask_lock(job):
        study = open_study(job)
        digest = bind_budget(study, job)
        fail_interrupted_trials(study, job)
        for number in requeue_interrupted(study, job.out_dir):
            LOGGER.info("[%s] trial %d will continue from its checkpoint", job.method, number)
    return study, digest


def _run_workers(job: TuneJob, jobs: int) -> None:
    """``jobs`` spawn workers on ``job``'s study; they die with this process. Trials always run
    in spawn workers (also for ``--jobs 1``): they start with tqdm disabled, so the console gets
    progress lines instead of PML's progress bars."""
    ctx = mp.get_context("spawn")
    shared = (torch.get_num_threads(), dict(registry._USER))  # noqa: SLF001
    with (
        child_environment(TQDM_DISABLE="1"),
        cf.ProcessPoolExecutor(
            jobs, mp_context=ctx, initializer=_worker_init, initargs=(os.getpid(),)
        ) as ex,
    ):
        futures = [ex.submit(_worker, job, k, *shared) for k in range(jobs)]
        for fut in futures:
            try:
                fut.result()
            except cf.process.BrokenProcessPool as e:
                raise StorageError(
                    f"[{job.method}] a tune worker died ({e}); rerun the same command to "
                    "continue (its trial is marked failed)"
                ) from e
            except sqlalchemy.exc.SQLAlchemyError as e:  # disk full, locked, server gone
                raise StorageError(
                    f"--storage {public_url(job.storage)}: {type(e).__name__}: "
                    f"{str(e).splitlines()[0]}; rerun the same command to continue"
                ) from e


optuna.logging.set_verbosity(optuna.logging.WARNING)
