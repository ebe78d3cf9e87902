"""Many runs: jobs (method x seed), the ``--jobs K`` worker pool, and failure isolation.

Every (method, seed) is an ordinary :func:`.runner.train` run in ``OUT/<method>/seed<i>``.
:func:`execute` runs a list of :class:`Job` in this process or in ``K`` ``spawn`` worker processes;
a run that raises (crash, non-finite loss, a bad object) is recorded in ``RUN_DIR/failed.json``
and returned as a failure record (:func:`is_failed`), and the other runs complete.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import json
import logging
import multiprocessing as mp
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import torch
import tqdm

from ..experiment import registry
from ..experiment.methods import slug
from . import distributed, run_folder, runner

LOGGER = logging.getLogger(__name__)
FAILED_FILE = "failed.json"


@dataclass
class Job:
    """One training run: ``name`` (method or sweep cell), ``run_id`` (``seed<i>``), config."""

    name: str
    run_id: str
    config: dict
    run_dir: Path


def make_jobs(configs: Mapping[str, dict], out_dir: Path, seeds: int) -> list[Job]:
    """Seeds ``seed, seed+1, ...`` (the config's ``seed`` plus the run index) for every config."""
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    jobs = []
    for name, base in configs.items():
        for i in range(seeds):
            cfg = copy.deepcopy(base)
            cfg["seed"] = int(cfg.get("seed", 0)) + i
            cfg["name"] = name
            jobs.append(Job(name, f"seed{i}", cfg, out_dir / slug(name) / f"seed{i}"))
    return jobs


_WORKER_SLOT: int | None = None


def _worker_init(slots, num_threads: int, registered: dict) -> None:
    global _WORKER_SLOT
    _WORKER_SLOT = slots.get()
    torch.set_num_threads(num_threads)
    for name, obj in registered.items():
        registry.register(name, obj, override=True)


def job_device(config: dict, device: str | None, slot: int | None) -> str | None:
    """Round robin over GPUs: worker ``slot`` gets ``cuda:<slot % count>`` when the run's device
    is plain ``cuda`` and several GPUs are visible; otherwise the device is unchanged."""
    want = device or config.get("device")
    if slot is None or want not in ("cuda", "gpu") or torch.cuda.device_count() < 2:
        return device
    return f"cuda:{slot % torch.cuda.device_count()}"


def run_job(job: Job, resume: bool, device: str | None = None, overwrite: bool = False) -> dict:
    """Train one job (or reuse its finished ``metrics.json`` with ``resume``); never raises for a
    failing run: returns ``{"failed": True, "error": ..., "traceback": ...}`` and writes it to
    ``RUN_DIR/failed.json``."""
    run_dir = job.run_dir
    done = run_dir / "metrics.json"
    if resume and done.exists():
        metrics = json.loads(done.read_text())
        if metrics.get("status") != "failed":  # runner.train records failures there too
            return metrics
    main = distributed.is_main_process()  # under torchrun every rank trains, rank 0 writes
    # A fresh run never wipes an earlier one silently: :func:`execute` refused already unless
    # ``overwrite``, and then ``runner.train`` removes only the run's own outputs.
    if main:
        (run_dir / FAILED_FILE).unlink(missing_ok=True)
    distributed.barrier()
    t0 = time.perf_counter()
    try:
        dev = job_device(job.config, device, _WORKER_SLOT)
        metrics = runner.train(
            job.config, run_dir, resume=resume, device=dev, overwrite=overwrite and not resume
        )
    except Exception as e:  # noqa: BLE001 -- isolate any failure of one run (reported below)
        record = {
            "failed": True,
            "name": job.name,
            "run_id": job.run_id,
            "error": f"{type(e).__name__}: {e}".strip(),
            "traceback": traceback.format_exc(),
            "wall_seconds": time.perf_counter() - t0,
        }
        LOGGER.error("run %s/%s failed: %s", job.name, job.run_id, record["error"])
        if main:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / FAILED_FILE).write_text(json.dumps(record, indent=2))
        return record
    metrics["wall_seconds"] = time.perf_counter() - t0
    if main:
        done.write_text(json.dumps(metrics, indent=2))
    distributed.barrier()
    return metrics


def execute(
    jobs: Sequence[Job],
    resume: bool,
    device: str | None = None,
    n_jobs: int = 1,
    desc="runs",
    overwrite: bool = False,
) -> dict[str, dict[str, dict]]:
    """Run ``jobs``; returns ``{name: {run_id: metrics or failure record}}`` in job order.

    Without ``resume`` or ``overwrite``, run folders that already hold a run's outputs are refused
    before anything trains (:class:`~.run_folder.RunFolderError` listing them); ``overwrite``
    replaces those outputs, ``resume`` reuses finished runs and continues the others.

    ``n_jobs > 1`` runs them in that many ``spawn`` worker processes (each with the parent's
    torch thread count and registered names, so results equal a sequential run); worker ``k``
    uses GPU ``k mod #GPUs`` when the device is ``cuda`` and several GPUs are visible.
    """
    if n_jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {n_jobs}")
    if n_jobs > 1 and distributed.world_size() > 1:
        raise ValueError("--jobs > 1 cannot be combined with torchrun; use one or the other")
    if not resume and not overwrite:
        used = [(j.run_dir, run_folder.describe_run(j.run_dir)) for j in jobs]
        used = [f"{d} ({what})" for d, what in used if what is not None]
        if used:
            raise run_folder.RunFolderError(
                f"{len(used)} run folder(s) already hold runs: {'; '.join(used[:5])}"
                f"{' ...' if len(used) > 5 else ''}; pass --resume to reuse and continue them, "
                "--overwrite to replace them, or give another --out"
            )
    results: dict[str, dict[str, dict]] = {}
    for job in jobs:
        results.setdefault(job.name, {})[job.run_id] = {}
    if n_jobs == 1 or len(jobs) <= 1:
        for job in tqdm.tqdm(jobs, desc=desc, unit="run"):
            results[job.name][job.run_id] = run_job(job, resume, device, overwrite)
        return results
    ctx = mp.get_context("spawn")
    slots = ctx.Queue()
    for k in range(n_jobs):
        slots.put(k)
    init = (slots, torch.get_num_threads(), dict(registry._USER))
    with cf.ProcessPoolExecutor(
        n_jobs, mp_context=ctx, initializer=_worker_init, initargs=init
    ) as ex:
        futures = {ex.submit(run_job, job, resume, device, overwrite): job for job in jobs}
        for fut in tqdm.tqdm(cf.as_completed(futures), total=len(jobs), desc=desc, unit="run"):
            job = futures[fut]
            try:
                results[job.name][job.run_id] = fut.result()
            except Exception as e:  # noqa: BLE001 -- a worker died (e.g. killed): record it
                results[job.name][job.run_id] = {
                    "failed": True,
                    "name": job.name,
                    "run_id": job.run_id,
                    "error": f"worker process failed: {type(e).__name__}: {e}",
                }
    return results


def is_failed(m: dict) -> bool:
    """A failure record of :func:`run_job` or a ``metrics.json`` the runner marked failed."""
    return bool(m.get("failed")) or m.get("status") == "failed"
