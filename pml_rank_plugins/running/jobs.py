"""What a run of ``compare``/``sweep`` is, and what its result means.

A :class:`Job` is one (name, seed) run in ``OUT/<slug(name)>/seed<S>``, named after the seed
``S`` it trains with (:func:`make_jobs`), a
folder that must stay inside ``--out`` (:func:`check_inside`). Its result is ``metrics.json``'s
content, a failure record (:func:`is_failed`; also written to ``RUN_DIR/failed.json``) or a
refused record (``is_refused``: the run never started because its folder was busy or unsafe,
and nothing of it is on disk). :mod:`.pool` runs jobs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..experiment.methods import check_folders, slug
from ..experiment.spec import RunSpec
from . import run_folder

FAILED_FILE = "failed.json"
LOGGER = logging.getLogger(__name__)


@dataclass
class Job:
    """One training run: ``name`` (method or sweep cell), ``run_id`` (``seed<S>``, ``S`` the
    spec's seed), its :class:`~pml_rank_plugins.experiment.RunSpec` (``config``, named
    ``name``), its folder, and the ``--out`` that folder must stay inside (``None``: not
    checked)."""

    name: str
    run_id: str
    config: RunSpec
    run_dir: Path
    out_dir: Path | None = None


def make_jobs(configs: Mapping[str, RunSpec | Mapping], out_dir: Path, seeds: int) -> list[Job]:
    """Seeds ``seed, seed+1, ...`` (the config's ``seed`` plus the run index) for every config
    (:meth:`~pml_rank_plugins.experiment.RunSpec.seeded_runs`; config mappings are parsed).

    Every run folder is ``OUT/<slug(name)>/seed<S>``, ``S`` the seed it trains with (so
    ``compare --tuned``, which trains on the seeds after the tuning seed, writes ``seed1``,
    ``seed2``, ...), and must resolve inside ``out_dir`` (``run_folder.inside``). The folder
    name is the run id that pairs runs across methods; methods starting from different seeds
    share no run id, so they are not paired (a warning says so).

    Raises:
        ConfigError: a name whose folder would not be one (empty, ``..``) or two names with one
            folder (``experiment.methods.check_folders``; sweep cells like ``path=a/b`` are
            slugged).
        UnsafeRunFolder: a run folder resolves outside ``out_dir`` (a symbolic link in ``OUT``).
    """
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    out_dir = Path(out_dir)
    check_folders(configs, kind="run", strict=False)
    jobs = []
    first_seeds: dict[str, int] = {}
    for name, base in configs.items():
        spec = RunSpec.of(base)
        first_seeds[name] = spec.seed
        for run in spec.seeded_runs(name, seeds):
            run_id = f"seed{run.seed}"
            job = Job(name, run_id, run, out_dir / slug(name) / run_id, out_dir)
            check_inside(job)
            jobs.append(job)
    if len(set(first_seeds.values())) > 1:
        LOGGER.warning(
            "the runs start from different seeds (%s): runs are paired by seed, so runs of "
            "different seeds are not compared pairwise",
            ", ".join(f"{n}: {s}" for n, s in first_seeds.items()),
        )
    return jobs


def check_inside(job: Job) -> None:
    """Raise :exc:`~pml_rank_plugins.running.UnsafeRunFolder` when the job's folder leaves its
    ``--out``."""
    if job.out_dir is not None and not run_folder.inside(job.out_dir, job.run_dir):
        raise run_folder.UnsafeRunFolder(
            f"{job.run_dir} resolves to {job.run_dir.resolve()}, outside --out "
            f"{job.out_dir.resolve()} (a symbolic link on the way?); remove the link or give "
            "another --out"
        )


def refused_record(job: Job, error: BaseException) -> dict:
    """The result of a run that did not start because its folder could not be used (busy with
    another live run, a symbolic link, outside ``--out``); nothing was written for it."""
    return {
        "refused": True,
        "name": job.name,
        "run_id": job.run_id,
        "error": f"{type(error).__name__}: {error}".strip(),
    }


def is_failed(m: dict) -> bool:
    """A failure record of :func:`~pml_rank_plugins.running.run_job` or a ``metrics.json`` the
    runner marked failed."""
    return bool(m.get("failed")) or m.get("status") == "failed"


def is_refused(m: dict) -> bool:
    """A run that never started because its folder could not be used (``refused_record``):
    neither finished nor failed, and nothing of it is on disk."""
    return bool(m.get("refused"))
