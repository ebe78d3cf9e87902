"""Side-by-side comparison: several methods x several seeds -> tables with 95% CIs, paired tests.

Every (method, seed) is an ordinary run in ``OUT/<method>/seed<S>`` (``S``: the seed it trains)
(:func:`pml_rank_plugins.running.runner.train`, through the worker pool of
:mod:`pml_rank_plugins.running.pool`); runs of different methods with the same seed are *paired* (same data order, same initial weights where
the model config is shared). The table reports, per method and test metric (at the best
validation epoch), mean +- 95% CI half-width (Student t) over the runs, and the paired difference
against a reference method with its 95% CI, paired t-test and (n >= 6) Wilcoxon p-values; see
:mod:`.statistics`. Outputs in ``OUT``: ``comparison.md``, ``comparison.csv`` (percent, like the
Markdown), ``summary.json`` (every number, metrics as fractions), ``val_map_at_r.png`` (validation
primary metric vs epoch, 95% band), ``recall_at_k.png`` (test Recall@K, 95% error bars),
``differences.png`` (paired differences vs the reference) and per method ``retrieval.png`` /
``worst_queries.png`` (:mod:`.retrieval`); every figure also as ``.pdf``.

Fault isolation: a run that raises (crash, non-finite loss, a bad object) is recorded in
``RUN_DIR/failed.json`` and in the table; the other runs complete. Config errors are found
before the first run (:func:`pml_rank_plugins.experiment.methods.check_methods`) and stop everything at once.
``--resume`` reuses finished runs (``metrics.json``), retries failed ones and re-summarizes:
:func:`.summary.summarize_dir` recomputes the tables from the run folders alone.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ..experiment.methods import check_methods, collect_methods, collected
from ..experiment.schema import equivalence_margin
from ..experiment.spec import RunSpec
from ..experiment.tuned import load_tuned, tuned_configs
from ..running import distributed
from ..running.pool import Job, execute, is_failed, is_refused, make_jobs
from . import retrieval
from .summary import add_command, summarize, write_outputs

LOGGER = logging.getLogger(__name__)


def run_comparison(
    configs: Sequence[str | Path | Mapping] | str | Path | Mapping,
    out_dir: str | Path,
    seeds: int = 1,
    overrides: Iterable[str] = (),
    methods: Sequence[str] | None = None,
    resume: bool = False,
    device: str | None = None,
    reference: str | None = None,
    jobs: int = 1,
    pictures: bool = True,
    overwrite: bool = False,
    data_root: str | None = None,
    tuned: str | Path | None = None,
    allow_budget_change: bool = False,
) -> dict:
    """Train every method with seeds ``seed, seed+1, ...``; write tables, plots and pictures.

    ``configs``: YAML paths and/or config dicts, or the ``{method: RunSpec}`` that
    :func:`~pml_rank_plugins.experiment.collect_methods` returned (the CLI's; then
    ``overrides``, ``methods`` and ``data_root`` were applied already and are not applied again,
    except that ``tuned`` applies ``overrides`` to the recorded configs). ``reference``: the method the others are compared
    with (default: the first). ``jobs``: worker processes. With ``resume`` a finished run
    (``metrics.json`` present) is reused, an interrupted one continued and a failed one retried;
    otherwise a folder holding an earlier run is refused unless ``overwrite``. ``data_root``: the
    configs' ``data_root`` (``--data-root``; a ``--set data_root=...`` wins). Returns the summary
    dict (see :func:`~pml_rank_plugins.reporting.summarize`); ``summary["failed"]`` lists failed
    runs (the CLI then exits non-zero). ``tuned``: the ``--out`` of a ``pml-rank tune`` run; every
    method is retrained from the config its study recorded plus its ``best_params``, on fresh seeds
    (after the tuning seed); a ``--set`` that changes the tuned budget is a ConfigError unless
    ``allow_budget_change`` (``experiment.tuned.tuned_configs``). ``summary["tuned_from"]``,
    ``tuned_params``, ``tuned_config_hash`` and ``budget_changes`` record what was trained.
    ``summary["commands"]``: the wall seconds of every command that wrote ``out_dir`` (a
    ``resume`` adds itself); ``total_wall_seconds`` and ``pictures_seconds`` are their sums.
    ``pictures``: draw each method's retrieval pictures (:func:`write_pictures`, with a progress
    bar); ``False`` draws none and leaves pictures already in ``out_dir`` untouched; with ``resume``
    only missing or out-of-date ones are drawn.
    """
    out_dir = Path(out_dir)
    if collected(configs):
        selected = dict(configs)
    else:
        selected = collect_methods(configs, overrides, methods, data_root)
    tuned_run = load_tuned(tuned) if tuned is not None else None
    changes: dict = {}
    if tuned_run is not None:
        tuned_cfgs, changes = tuned_configs(
            tuned_run, selected, overrides, data_root, allow_budget_change, subset=bool(methods)
        )
        selected = {m: RunSpec.parse(c) for m, c in tuned_cfgs.items()}  # new configs: once
    if reference is not None and reference not in selected:
        raise ValueError(f"--reference {reference!r}: not one of the methods {list(selected)}")
    check_methods(selected)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    all_jobs = make_jobs(selected, out_dir, seeds)
    results = execute(all_jobs, resume, device, jobs, desc="compare", overwrite=overwrite)
    first = RunSpec.of(next(iter(selected.values())))
    margin = equivalence_margin(first)
    summary = summarize(
        results, reference=reference, primary=first.eval.primary_metric, margin=margin
    )
    summary["total_wall_seconds"] = time.perf_counter() - t_all
    summary["seeds"] = seeds
    summary["jobs"] = jobs
    if tuned_run is not None:
        summary["tuned_from"] = str(tuned)
        summary["tuned_params"] = {m: tuned_run["methods"][m]["best_params"] for m in selected}
        summary["tuned_config_hash"] = {m: tuned_run["methods"][m]["config_hash"] for m in selected}
        summary["budget_changes"] = changes
    if distributed.is_main_process():  # under torchrun: rank 0 writes
        if pictures:  # with resume: only missing or out-of-date pictures are drawn
            t_pictures = time.perf_counter()
            summary["pictures"] = write_pictures(results, all_jobs, device, only_missing=resume)
            # where the command's wall time goes (the runs' own phases are in metrics.json)
            summary["pictures_seconds"] = time.perf_counter() - t_pictures
            summary["total_wall_seconds"] = time.perf_counter() - t_all
        add_command(summary, out_dir / "summary.json" if resume else None, jobs)
        write_outputs(summary, results, out_dir)
    distributed.barrier()
    return summary


def write_pictures(
    results: dict,
    jobs: Sequence[Job],
    device: str | None,
    only_missing: bool = False,
    pdf: bool | None = None,
) -> dict:
    """Retrieval pictures for the first successful run of each name, into ``<name>/``.

    What is drawn comes from each run's ``eval.pictures``
    (:class:`~pml_rank_plugins.experiment.spec.PictureSettings`: queries per figure, ``k``, PDF
    copies); ``pdf`` overrides the config's PDF setting when given.

    Shows a ``pictures`` progress bar (one step per method, like the runs' bar) and logs one
    line per method with what it wrote and how long it took. Each method costs one embedding
    pass over its test split plus two figures
    (:func:`~pml_rank_plugins.reporting.write_retrieval_pictures`). ``only_missing`` (``--resume``):
    a method whose pictures are all present and newer than its run's checkpoint is skipped without
    building anything, and only missing or out-of-date files are written; no picture is deleted. A
    method whose pictures fail is logged and recorded as ``"failed: ..."``; the other methods and
    the tables go on.
    """
    todo = []
    for name, by_run in results.items():
        job = next(
            (
                j
                for j in jobs
                if j.name == name
                and not is_failed(m := by_run.get(j.run_id, {}))
                and not is_refused(m)
            ),
            None,
        )
        if job is not None:
            todo.append((name, job))
    out = {}
    bar = {"desc": "pictures", "unit": "method"}
    if not todo:  # an explicit False would override TQDM_DISABLE=1
        bar["disable"] = True
    with logging_redirect_tqdm():
        for name, job in tqdm.tqdm(todo, **bar):
            t0 = time.perf_counter()
            settings = job.config.eval.pictures
            with_pdf = settings.pdf if pdf is None else pdf
            try:
                missing = (
                    retrieval.missing_pictures(job.run_dir, job.run_dir.parent, with_pdf)
                    if only_missing
                    else None
                )
                paths = retrieval.write_retrieval_pictures(
                    job.run_dir,
                    job.run_dir.parent,
                    device,
                    num_queries=settings.num_queries,
                    k=settings.k,
                    pdf=with_pdf,
                    only_missing=only_missing,
                    spec=job.config,
                )
                out[name] = [str(p) for p in paths]
            except Exception as e:  # noqa: BLE001 -- pictures are a bonus; never lose the table
                LOGGER.warning(
                    "retrieval pictures for %s failed: %s: %s", name, type(e).__name__, e
                )
                out[name] = f"failed: {type(e).__name__}: {e}"
                continue
            written = [Path(p).name for p in (paths if missing is None else missing)]
            if not written:
                LOGGER.info("pictures of %s: up to date in %s", name, job.run_dir.parent)
            else:
                LOGGER.info(
                    "pictures of %s: %s in %s (%.1f s)",
                    name,
                    ", ".join(written),
                    job.run_dir.parent,
                    time.perf_counter() - t0,
                )
    return out
