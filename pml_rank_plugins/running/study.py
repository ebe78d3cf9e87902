"""The studies of ``pml-rank tune``: one per method, in one Optuna storage.

:class:`TuneJob` is one method's study (config, trial budget, storage, ``--out``).
:func:`open_study` creates or loads it (a loaded study must maximize; storage errors are one
:class:`~.run_folder.StorageError` line naming the URL without its password);
:func:`bind_budget` records the trials' config (the budget), its hash and the objective in the
study's attributes, or refuses to continue a study tuned with another config; :func:`ask_lock`
serializes "count the trials, then ask one" across processes (a file lock in ``OUT``, opened
without following symlinks) and machines (a PostgreSQL advisory lock); :func:`study_summary` is
one method's entry of ``tune.json``.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import os
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np
import optuna
import sqlalchemy
from optuna.trial import TrialState

from ..experiment.schema import ConfigError
from ..experiment.search_space import optuna_object, tune_section
from ..experiment.spec import DEFAULT_PRIMARY, EvalSettings, RunSpec  # noqa: F401 -- re-exported
from ..experiment.tuned import budget_config, config_hash, differences
from . import run_folder
from .run_folder import StorageError

ASK_LOCK = ".tune-ask.lock"


@dataclass
class TuneJob:
    """One method's study: its config, the trial budget and where everything goes."""

    method: str
    config: RunSpec | dict
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


def sampler_seed(seed: int, worker: int, n_trials: int) -> int:
    """The seed of worker ``worker``'s sampler on a study that holds ``n_trials`` trials.

    A fresh study (``n_trials == 0``): ``seed + worker``, so equal seeds do not make every
    worker draw the same values. A continued study: a seed drawn from ``(seed, worker,
    n_trials)`` (``numpy.random.SeedSequence``), because a sampler seeded as before would replay
    the draws it made before the interruption: TPE's random start-up trials would repeat
    finished trials' parameters exactly (it did: 4 of PML MultiSimilarity's trials in the
    Omniglot study). Deterministic, so a continued study is still reproducible from its
    history. O(1)."""
    if n_trials == 0:
        return seed + worker
    return int(np.random.SeedSequence([seed, worker, n_trials]).generate_state(1)[0])


def open_study(job: TuneJob, worker: int = 0) -> optuna.Study:
    """Create or load the method's study in ``job.storage``, its sampler seeded by
    :func:`sampler_seed` when the config gives the sampler an integer ``seed``.

    A loaded study must maximize; storage errors (corrupt, locked or unreachable database) are
    :class:`StorageError` naming the URL."""
    section = tune_section(job.config)
    study = _create_or_load(job, section)
    sampler = section["sampler"]
    name, kwargs = next(iter(sampler.items())) if isinstance(sampler, dict) else (None, None)
    if isinstance(kwargs, dict) and isinstance(kwargs.get("seed"), int):
        n_trials = len(study.get_trials(deepcopy=False))
        seed = sampler_seed(kwargs["seed"], worker, n_trials)
        study.sampler = optuna_object(
            {name: {**kwargs, "seed": seed}}, optuna.samplers, "tune.sampler"
        )
    return study


def _create_or_load(job: TuneJob, section: dict) -> optuna.Study:
    sampler_obj = optuna_object(copy.deepcopy(section["sampler"]), optuna.samplers, "tune.sampler")
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
        primary = EvalSettings.parse(job.config).primary_metric
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


_ENGINES: dict[str, sqlalchemy.engine.Engine] = {}


def _lock_engine(url: str) -> sqlalchemy.engine.Engine:
    """One engine per storage URL and process, for the advisory lock's connection."""
    if url not in _ENGINES:
        _ENGINES[url] = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    return _ENGINES[url]


@contextlib.contextmanager
def ask_lock(job: TuneJob) -> Iterator[None]:
    """Serialize "count the trials, then ask one" (and opening the storage) across processes
    (file lock in ``OUT``) and, with PostgreSQL, across machines (advisory lock keyed by the
    study name)."""
    job.out_dir.mkdir(parents=True, exist_ok=True)
    fd = run_folder.open_lock_file(job.out_dir / ASK_LOCK)  # never through a symlink
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


INTERRUPTED_PREFIX = "interrupted"


def is_interrupted(trial: optuna.trial.FrozenTrial) -> bool:
    """True for a FAIL trial that did not fail but was interrupted (its process was killed or the
    session ended): such a trial holds no outcome, so it does not count toward the study's
    ``--trials`` (every method gets the same number of finished trials). A trial that raised
    records its ``error`` before it is told FAIL; an interrupted one has no ``error`` (killed
    before this rule existed) or one starting with ``"interrupted"``."""
    if trial.state != TrialState.FAIL:
        return False
    error = trial.user_attrs.get("error")
    return error is None or str(error).startswith(INTERRUPTED_PREFIX)


def counted_trials(study: optuna.Study) -> int:
    """The trials that count toward ``--trials``: every trial but the interrupted ones and the
    WAITING ones (enqueued continuations of interrupted trials count once a worker asks for
    them: :mod:`.trial_resume`)."""
    return sum(
        not is_interrupted(t) and t.state != TrialState.WAITING
        for t in study.get_trials(deepcopy=False)
    )


def study_summary(study: optuna.Study, wall_seconds: float, config: Mapping) -> dict:
    """One method's entry of ``tune.json``: ``best_params`` (key path -> value), ``best_value``,
    ``best_trial``, ``n_trials`` (the trials that count: complete + pruned + failed + running,
    interrupted ones apart), ``n_interrupted`` (FAIL trials whose process was killed, see
    :func:`is_interrupted`), ``states`` (count per state, interrupted ones included in
    ``fail``), ``wall_seconds`` (this call), ``trial_seconds`` (the summed durations of every
    finished trial of the study, over all the calls that ran them; an interrupted trial is left
    out: its end is when a later call marked it, not when its process died, and the trial that
    continued it counts), ``seed`` (every trial's),
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
        "n_trials": counted_trials(study),
        "n_interrupted": sum(is_interrupted(t) for t in trials),
        "states": states,
        "wall_seconds": wall_seconds,
        "trial_seconds": sum(
            t.duration.total_seconds()
            for t in trials
            if t.duration is not None and not is_interrupted(t)
        ),
        "seed": RunSpec.of(config).seed,
        "direction": study.direction.name.lower(),
    }
