"""Many runs: jobs (method x seed), the ``--jobs K`` worker pool, and failure isolation.

Every (method, seed) is an ordinary :func:`.runner.train` run in ``OUT/<method>/seed<S>``
(``S``: the seed it trains).
:func:`execute` runs a list of :class:`Job` in this process or in ``K`` ``spawn`` worker processes;
a run that raises (crash, non-finite loss, a bad object) is recorded in ``RUN_DIR/failed.json``
and returned as a failure record (:func:`is_failed`), and the other runs complete. Each run holds
its folder's lock from before its first write to after its last, so a run whose folder another
live process uses (two ``compare`` on one ``--out``) is *refused* (``is_refused``: not
failed, nothing written or removed there), and a ``failed.json`` is only ever written or removed
by the run that holds the folder. Every run folder stays inside ``--out``
(``run_folder.inside``).

Workers show no progress bars of their own (the parent shows one for all runs), exit when the
parent dies, and send their log lines to the parent (:mod:`.console`: each line labelled with its
run, repeated lines folded).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import logging
import logging.handlers
import multiprocessing as mp
import os
import socket
import time
import traceback
from typing import Sequence

import torch
import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ..experiment import registry
from ..experiment.spec import RunSpec
from . import distributed, run_folder, runner
from .console import (
    ToParentLoggers,
    child_environment,
    log_to_parent,
    logger_levels,
    repeated_logs_once,
    run_label,
)
from .jobs import FAILED_FILE, Job, check_inside, is_failed, is_refused, make_jobs, refused_record
from .parent import exit_with_parent

# Callers import the jobs' names from here too (they lived in this module).
__all__ = [
    "FAILED_FILE",
    "Job",
    "execute",
    "is_failed",
    "is_refused",
    "make_jobs",
    "refused_record",
    "repeated_logs_once",
    "run_job",
    "run_label",
]

LOGGER = logging.getLogger(__name__)


_WORKER_SLOT: int | None = None


def _worker_init(
    slots, num_threads: int, registered: dict, parent_pid: int, log_queue, levels: dict
) -> None:
    global _WORKER_SLOT
    exit_with_parent(parent_pid)  # one helper for compare and tune workers
    log_to_parent(log_queue, levels)
    _WORKER_SLOT = slots.get()
    torch.set_num_threads(num_threads)
    for name, obj in registered.items():
        registry.register(name, obj, override=True)


def job_device(config: RunSpec, device: str | None, slot: int | None) -> str | None:
    """Round robin over GPUs: worker ``slot`` gets ``cuda:<slot % count>`` when the run's device
    is plain ``cuda`` and several GPUs are visible; otherwise the device is unchanged."""
    want = RunSpec.of(config).device_for(device)
    if slot is None or want not in ("cuda", "gpu") or torch.cuda.device_count() < 2:
        return device
    return f"cuda:{slot % torch.cuda.device_count()}"


def run_job(job: Job, resume: bool, device: str | None = None, overwrite: bool = False) -> dict:
    """Train one job (or reuse its finished ``metrics.json`` with ``resume``); never raises for a
    failing run: returns ``{"failed": True, "error": ..., "traceback": ..., "writer": {pid,
    host}}`` and writes it to ``RUN_DIR/failed.json``.

    The run folder's lock (``run_folder.lock``) is held for the whole call, so everything
    written or removed here -- a stale ``failed.json`` of an earlier attempt, the run, its
    failure record -- happens in a folder no other live run uses. A folder that is busy (another
    live run holds it), a symbolic link or outside ``--out`` gives ``refused_record``, and
    nothing is written into it or removed from it.
    """
    run_dir = job.run_dir
    try:
        check_inside(job)
    except run_folder.UnsafeRunFolder as e:
        return _refused(job, e)
    main = distributed.is_main_process()  # under torchrun every rank trains, rank 0 writes
    with contextlib.ExitStack() as stack:
        holding = False
        if main:
            try:
                stack.enter_context(run_folder.lock(run_dir, nested=True))
                holding = True
            except (run_folder.RunFolderBusy, run_folder.UnsafeRunFolder) as e:
                if not distributed.launched_by_torchrun():
                    return _refused(job, e)
                # torchrun: runner.train raises the same refusal on every rank (caught below)
        done = run_dir / "metrics.json"
        if resume and done.exists():
            metrics = json.loads(done.read_text())
            if metrics.get("status") != "failed":  # runner.train records failures there too
                if holding:  # a finished run: a failure record beside it is an earlier attempt's
                    (run_dir / FAILED_FILE).unlink(missing_ok=True)
                return metrics
        # A fresh run never wipes an earlier one silently: :func:`execute` refused already unless
        # ``overwrite``, and then ``runner.train`` removes only the run's own outputs.
        alone = holding and not distributed.launched_by_torchrun()  # ranks must stay in step
        found = run_folder.describe_run(run_dir) if alone and not resume else None
        if found is not None and not overwrite:  # written since execute() looked: another
            return _refused(  # command's run, which a failure record here would misreport
                job,
                run_folder.RunFolderError(
                    f"{run_dir} now holds {found}, written by another process since this command "
                    "started; pass --resume to reuse it"
                ),
            )
        if holding:
            (run_dir / FAILED_FILE).unlink(missing_ok=True)
        distributed.barrier()
        return _train_job(job, resume, device, overwrite, holding)


def _refused(job: Job, error: BaseException) -> dict:
    LOGGER.error("run %s/%s refused: %s", job.name, job.run_id, error)
    return refused_record(job, error)


def _train_job(job: Job, resume: bool, device: str | None, overwrite: bool, holding: bool) -> dict:
    """Train ``job`` (its folder locked by this thread when ``holding``); failures recorded."""
    run_dir = job.run_dir
    t0 = time.perf_counter()
    try:
        dev = job_device(job.config, device, _WORKER_SLOT)
        with run_label(f"{job.name} {job.run_id}"), distributed.named_timeouts():
            metrics = runner.train(
                job.config, run_dir, resume=resume, device=dev, overwrite=overwrite and not resume
            )
    except distributed.RankTimeoutError:
        raise  # under torchrun a silent rank stops every run on every rank, not just this one
    except (run_folder.RunFolderBusy, run_folder.UnsafeRunFolder) as e:
        return _refused(job, e)  # torchrun: rank 0 could not lock; nothing was written
    except Exception as e:  # noqa: BLE001 -- isolate any failure of one run (reported below)
        record = {
            "failed": True,
            "name": job.name,
            "run_id": job.run_id,
            "error": f"{type(e).__name__}: {e}".strip(),
            "traceback": traceback.format_exc(),
            "wall_seconds": time.perf_counter() - t0,
            "writer": {"pid": os.getpid(), "host": socket.gethostname()},
        }
        LOGGER.error("run %s/%s failed: %s", job.name, job.run_id, record["error"])
        if holding:
            run_folder.write_text(run_dir / FAILED_FILE, json.dumps(record, indent=2))
        return record
    metrics["wall_seconds"] = time.perf_counter() - t0
    if holding:
        run_folder.write_text(run_dir / "metrics.json", json.dumps(metrics, indent=2))
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
    before anything trains (:exc:`~pml_rank_plugins.running.RunFolderError` listing them);
    ``overwrite`` replaces those outputs, ``resume`` reuses finished runs (removing a stale
    ``failed.json`` beside a finished ``metrics.json``) and continues the others. A run whose folder
    is in use by another live process, or unsafe, is returned as a ``refused_record``
    (``is_refused``).

    ``n_jobs > 1`` runs them in that many ``spawn`` worker processes (each with the parent's
    torch thread count and registered names, so results equal a sequential run); worker ``k``
    uses GPU ``k mod #GPUs`` when the device is ``cuda`` and several GPUs are visible.
    Every run's log lines carry its label (``[name seed<S>] ...``, ``console.run_label``); workers'
    lines are printed by this process, workers draw no progress bars and exit if this process
    dies; lines repeated across runs are printed once with a count (:func:`repeated_logs_once`).

    Raises:
        ValueError: ``n_jobs < 1``, or ``n_jobs > 1`` under torchrun.
        RunFolderError: used run folders without ``resume`` or ``overwrite``.
        RankTimeoutError: under torchrun, a rank did not answer (every rank stops).
    """
    if n_jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {n_jobs}")
    if n_jobs > 1 and distributed.world_size() > 1:
        raise ValueError("--jobs > 1 cannot be combined with torchrun; use one or the other")
    if not resume and not overwrite:
        refuse_used_folders(jobs)
    results: dict[str, dict[str, dict]] = {}
    for job in jobs:
        results.setdefault(job.name, {})[job.run_id] = {}
    # only rank 0 draws the bar under torchrun; log lines are printed above it, not through it
    bar = {"desc": desc, "unit": "run"}
    if not distributed.is_main_process():  # an explicit False would override TQDM_DISABLE=1
        bar["disable"] = True
    with logging_redirect_tqdm(), repeated_logs_once():
        if n_jobs == 1 or len(jobs) <= 1:
            for job in tqdm.tqdm(jobs, **bar):
                results[job.name][job.run_id] = run_job(job, resume, device, overwrite)
        else:
            _run_in_workers(jobs, results, resume, device, n_jobs, overwrite, bar)
    return results


def refuse_used_folders(jobs: Sequence[Job]) -> None:
    """:exc:`~pml_rank_plugins.running.RunFolderError` listing the jobs' folders that hold a run
    already."""
    used = [(j.run_dir, run_folder.describe_run(j.run_dir)) for j in jobs]
    used = [f"{d} ({what})" for d, what in used if what is not None]
    if used:
        raise run_folder.RunFolderError(
            f"{len(used)} run folder(s) already hold runs: {'; '.join(used[:5])}"
            f"{' ...' if len(used) > 5 else ''}; pass --resume to reuse and continue them, "
            "--overwrite to replace them, or give another --out"
        )


def _run_in_workers(jobs, results, resume, device, n_jobs: int, overwrite: bool, bar: dict):
    ctx = mp.get_context("spawn")
    slots = ctx.Queue()
    for k in range(n_jobs):
        slots.put(k)
    log_queue = ctx.Queue()
    listener = logging.handlers.QueueListener(log_queue, ToParentLoggers())
    init = (
        slots,
        torch.get_num_threads(),
        dict(registry._USER),
        os.getpid(),
        log_queue,
        logger_levels(),
    )
    listener.start()
    try:
        with cf.ProcessPoolExecutor(
            n_jobs, mp_context=ctx, initializer=_worker_init, initargs=init
        ) as ex:
            # the pool starts its workers on submit
            with child_environment(TQDM_DISABLE="1"):
                futures = {ex.submit(run_job, job, resume, device, overwrite): job for job in jobs}
            _collect(futures, results, bar)
    finally:
        listener.stop()


def _collect(futures: dict, results: dict, bar: dict) -> None:
    for fut in tqdm.tqdm(cf.as_completed(futures), total=len(futures), **bar):
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
