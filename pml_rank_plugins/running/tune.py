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
RUNNING by a killed process on this machine is marked FAIL (its run folder's lock is free), and
new trials are added until the study holds ``trials``. A trial counts as interrupted only when the
process that asked for it (``pid`` attribute, this machine) is gone; its run folder is then marked
FAIL. A failing trial (exception, non-finite loss) is recorded FAIL in the study and in its
folder, and the study goes on. Workers die with the ``tune`` process (:mod:`.parent`), and no more
workers start than trials are left.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import copy
import fcntl
import logging
import multiprocessing as mp
import os
import socket
import time
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import optuna
import sqlalchemy
import torch
from optuna.trial import TrialState

from ..experiment import registry
from ..experiment.methods import slug
from ..experiment.mlrc import is_mlrc
from ..experiment.schema import ConfigError
from ..experiment.search_space import (
    Param,
    apply_params,
    check_tune_config,
    optuna_object,
    tune_section,
)
from ..experiment.tuned import budget_config, config_hash, differences
from . import distributed, run_folder, runner
from .parent import exit_with_parent, pid_alive
from .pool import child_environment

LOGGER = logging.getLogger(__name__)
ASK_LOCK = ".tune-ask.lock"


@dataclass
class TuneJob:
    """One method's study: its config, the trial budget and where everything goes."""

    method: str
    config: dict
    trials: int
    storage: str
    out_dir: Path
    device: str | None = None

    @property
    def budget(self) -> tuple[dict, str | None]:
        """``(recorded config, data_root)``: what the trials train (:func:`budget_config`)."""
        return budget_config(self.config)


def default_storage(out_dir: str | Path) -> str:
    """``sqlite:///OUT/tune.db`` (absolute)."""
    return f"sqlite:///{(Path(out_dir) / 'tune.db').resolve()}"


def public_url(url: str) -> str:
    """The storage URL with its password removed (for ``tune.json`` and the console)."""
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        return url


def refuse_in_memory(url: str) -> None:
    """In-memory SQLite (``sqlite://``, ``sqlite:///:memory:``) is private to one process: the
    workers' trials would be lost, so it is a config error."""
    if url.startswith("sqlite") and (url.rstrip("/") == "sqlite:" or ":memory:" in url):
        raise ConfigError(
            f"--storage {url}: in-memory SQLite is private to one process, so the workers' "
            "trials would be lost; give a file (sqlite:///OUT/tune.db) or a server URL"
        )


def make_storage(url: str) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage; SQLite waits for its lock instead of failing at once."""
    refuse_in_memory(url)
    kwargs = {"connect_args": {"timeout": 120}} if url.startswith("sqlite") else {}
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except (sqlalchemy.exc.ArgumentError, ImportError, ModuleNotFoundError) as e:
        raise ConfigError(f"--storage {public_url(url)}: {type(e).__name__}: {e}") from e


def open_study(job: TuneJob, worker: int = 0) -> optuna.Study:
    """Create or load the method's study in ``job.storage``. Worker ``k`` of ``--jobs`` adds
    ``k`` to the sampler's ``seed`` (equal seeds would make every worker draw the same values).

    A loaded study must maximize; storage errors (corrupt, locked or unreachable database) are
    :class:`StorageError` naming the URL."""
    section = tune_section(job.config)
    sampler = copy.deepcopy(section["sampler"])
    if worker and isinstance(sampler, dict):
        name, kwargs = next(iter(sampler.items()))
        if isinstance(kwargs, dict) and isinstance(kwargs.get("seed"), int):
            sampler = {name: {**kwargs, "seed": kwargs["seed"] + worker}}
    sampler_obj = optuna_object(sampler, optuna.samplers, "tune.sampler")
    pruner = optuna_object(section["pruner"], optuna.pruners, "tune.pruner")
    try:
        study = optuna.create_study(
            storage=make_storage(job.storage),
            study_name=job.method,
            direction="maximize",
            load_if_exists=True,
            sampler=sampler_obj,
            pruner=pruner or optuna.pruners.NopPruner(),
        )
    except ConfigError:
        raise
    except (sqlalchemy.exc.SQLAlchemyError, ValueError, RuntimeError) as e:
        raise StorageError(f"--storage {public_url(job.storage)}: {type(e).__name__}: {e}") from e
    if study.direction != optuna.study.StudyDirection.MAXIMIZE:
        raise StorageError(
            f"--storage {public_url(job.storage)}: study {job.method!r} is set to "
            f"{study.direction.name.lower()}, but the objective is maximized; use a new --out"
        )
    return study


class StorageError(RuntimeError):
    """The study's storage cannot be used (exit 1, one line naming the URL)."""


def bind_budget(study: optuna.Study, job: TuneJob) -> str:
    """Record the trials' config, its hash and the objective in the study's attributes (first
    time), or check that a continued study was tuned with the same config. Returns the hash.

    Raises :class:`ConfigError` naming the keys that differ: trials of one study must share one
    budget, or its best setting is tuned for no budget in particular."""
    config, root = job.budget
    digest = config_hash(config)
    attrs = study.user_attrs
    if "config_hash" not in attrs:
        if study.get_trials(deepcopy=False):
            raise ConfigError(
                f"[{job.method}] the study in {public_url(job.storage)} has trials but no "
                "recorded config (made before budgets were recorded); tune into a new --out"
            )
        primary = (job.config.get("eval") or {}).get("primary_metric", DEFAULT_PRIMARY)
        study.set_user_attr("config", config)
        study.set_user_attr("config_hash", digest)
        study.set_user_attr("data_root", root)
        study.set_user_attr("objective", f"validation {primary} at the best epoch")
        with warnings.catch_warnings():  # experimental in Optuna; names the dashboard's axis
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([f"validation {primary}"])
    elif attrs["config_hash"] != digest:
        keys = list(differences(attrs.get("config") or {}, config))
        raise ConfigError(
            f"[{job.method}] the study in {public_url(job.storage)} was tuned with another "
            f"config (differs at {', '.join(keys[:5]) or 'its hash'}); continue it with the "
            "same config and --set, or tune into a new --out"
        )
    return digest


DEFAULT_PRIMARY = "mean_average_precision_at_r"


_ENGINES: dict[str, sqlalchemy.engine.Engine] = {}


def _lock_engine(url: str) -> sqlalchemy.engine.Engine:
    """One engine per storage URL and process, for the advisory lock's connection."""
    if url not in _ENGINES:
        _ENGINES[url] = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    return _ENGINES[url]


def _open_lock_file(path: Path) -> int:
    """The ask-lock file, opened without following a symlink (a symlink planted in a received
    folder must not make us create or write its target)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        if path.is_symlink():
            raise run_folder.RunFolderError(
                f"{path}: is a symbolic link; refusing to use it as a lock (remove it)"
            ) from e
        raise


@contextlib.contextmanager
def ask_lock(job: TuneJob) -> Iterator[None]:
    """Serialize "count the trials, then ask one" (and opening the storage) across processes
    (file lock in ``OUT``) and, with PostgreSQL, across machines (advisory lock keyed by the
    study name)."""
    job.out_dir.mkdir(parents=True, exist_ok=True)
    fd = _open_lock_file(job.out_dir / ASK_LOCK)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if job.storage.startswith("postgresql"):
            key = zlib.crc32(job.method.encode())
            try:
                conn = _lock_engine(job.storage).connect()
            except sqlalchemy.exc.SQLAlchemyError as e:
                raise StorageError(
                    f"--storage {public_url(job.storage)}: {type(e).__name__}: {e}"
                ) from e
            with conn:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": key})
                try:
                    yield
                finally:
                    conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
        else:
            yield
    finally:
        os.close(fd)  # releases the flock


def trial_folder(job: TuneJob, number: int) -> Path:
    """``OUT/<method>/trial<k>``, absolute and resolved (the trial attribute ``run_dir``)."""
    return job.out_dir.resolve() / slug(job.method) / f"trial{number}"


def fail_interrupted_trials(study: optuna.Study, job: TuneJob) -> list[int]:
    """Mark FAIL every RUNNING trial of this machine whose owner process is gone and whose run
    folder is not locked; returns their numbers. Trials of other machines are left to their
    owners; a trial whose ``run_dir`` lies outside ``--out`` (a tampered storage) is refused."""
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
        study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)  # noqa: SLF001
        failed.append(t.number)
    return failed


def suggest(trial: optuna.Trial, param: Param) -> Any:
    """Draw ``param`` from ``trial`` (the parameter is named by its key path)."""
    if param.kind == "int":
        return trial.suggest_int(param.path, param.low, param.high, log=param.log)
    if param.kind == "float":
        return trial.suggest_float(param.path, param.low, param.high, log=param.log)
    return trial.suggest_categorical(param.path, list(param.choices))


def trial_config(job: TuneJob, params: Mapping[str, Any], number: int) -> dict:
    """The run config of one trial: the tuned values set, no test splits (tuning must not see
    them), named ``<method> trial<k>``."""
    cfg = apply_params(job.config, params)
    ev = cfg.setdefault("eval", {})
    ev["test"] = []
    ev.pop("revisited", None)
    cfg["name"] = f"{job.method} trial{number}"
    return cfg


def train_trial(trial: optuna.Trial, config: dict, run_dir: Path, device: str | None) -> float:
    """Train one trial; report each validated epoch to the pruner (and a progress line). Returns
    the objective; raises :class:`optuna.TrialPruned` when the pruner stopped it (after that
    epoch's checkpoint)."""
    epochs = _num_epochs(config)

    def report(row: dict) -> bool:
        value = _row_value(config, row) if row.get("validation") else None
        if value is None:
            return False
        LOGGER.info(
            "[%s] epoch %s/%s: validation %.4f", config.get("name"), row["epoch"], epochs, value
        )
        trial.report(value, row["epoch"])
        return trial.should_prune()

    on_epoch = None if is_mlrc(config) else report  # MLRC's epochs are per fold: not pruned
    m = runner.train(config, run_dir, device=device, on_epoch=on_epoch)
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


def _row_value(config: dict, row: dict) -> float | None:
    ev = config.get("eval") or {}
    primary = ev.get("primary_metric", DEFAULT_PRIMARY)
    first = next(iter(row["validation"].values()), {})
    value = first.get(primary)
    return None if value is None else float(value)


def _ask(job: TuneJob, study: optuna.Study) -> tuple[optuna.Trial, Path] | None:
    """Under the ask lock: a new trial with its absolute run folder and owner recorded, or None
    when the study holds ``job.trials``."""
    with ask_lock(job):
        if len(study.get_trials(deepcopy=False)) >= job.trials:
            return None
        trial = study.ask()
        run_dir = trial_folder(job, trial.number)
        trial.set_user_attr("run_dir", str(run_dir))
        trial.set_user_attr("host", socket.gethostname())
        trial.set_user_attr("pid", os.getpid())
        return trial, run_dir


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
        trial, run_dir = asked
        try:
            exhausted = _run_one(job, study, trial, space, run_dir)
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
    job: TuneJob, study: optuna.Study, trial: optuna.Trial, space: Mapping, run_dir: Path
) -> bool:
    """Train and tell one trial; True when the sampler's space is exhausted."""
    params = {p.path: suggest(trial, p) for p in space.values()}
    config = trial_config(job, params, trial.number)
    t0 = time.perf_counter()
    value, state, error = None, TrialState.COMPLETE, None
    try:
        value = train_trial(trial, config, run_dir, job.device)
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
        with ask_lock(job):  # two tunes started together create the storage once
            study = open_study(job)
            digest = bind_budget(study, job)
        for number in fail_interrupted_trials(study, job):
            LOGGER.warning("[%s] trial %d was interrupted; marked failed", method, number)
        t0 = time.perf_counter()
        left = job.trials - len(study.get_trials(deepcopy=False))
        if left > 0:
            _run_workers(job, min(jobs, left))
        # reloaded: the workers added the trials through their own connections
        studies[method] = open_study(job)
        results[method] = study_summary(studies[method], time.perf_counter() - t0, cfg)
        results[method].update(config=job.budget[0], config_hash=digest, data_root=job.budget[1])
    return {"storage": public_url(url), "methods": results}, studies


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


def study_summary(study: optuna.Study, wall_seconds: float, config: Mapping) -> dict:
    """One method's entry of ``tune.json``: ``best_params`` (key path -> value), ``best_value``,
    ``best_trial``, ``n_trials`` (every trial: complete + pruned + failed + running),
    ``states`` (count per state), ``wall_seconds`` (this call), ``seed`` (every trial's),
    ``direction`` (always ``maximize``); :func:`tune` adds ``config``, ``config_hash`` and
    ``data_root``."""
    trials = study.get_trials(deepcopy=False)
    states: dict[str, int] = {}
    for t in trials:
        states[t.state.name.lower()] = states.get(t.state.name.lower(), 0) + 1
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    best = max(complete, key=lambda t: t.value) if complete else None
    return {
        "best_params": dict(best.params) if best else None,
        "best_value": best.value if best else None,
        "best_trial": best.number if best else None,
        "n_trials": len(trials),
        "states": states,
        "wall_seconds": wall_seconds,
        "seed": int(config.get("seed", 0)),
        "direction": study.direction.name.lower(),
    }


optuna.logging.set_verbosity(optuna.logging.WARNING)
