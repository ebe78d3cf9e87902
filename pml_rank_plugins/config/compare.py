"""Side-by-side comparison: several methods x several seeds -> tables with 95% CIs, paired tests.

Every (method, seed) is an ordinary :func:`runner.train` run in ``OUT/<method>/seed<i>``; runs
of different methods with the same seed are *paired* (same data order, same initial weights where
the model config is shared). The table reports, per method and test metric (at the best
validation epoch), mean +- 95% CI half-width (Student t) over the runs, and the paired difference
against a reference method with its 95% CI, paired t-test and (n >= 6) Wilcoxon p-values; see
:mod:`.statistics`. Outputs in ``OUT``: ``comparison.md``, ``comparison.csv`` (percent, like the
Markdown), ``summary.json`` (every number, metrics as fractions), ``val_map_at_r.png`` (validation
primary metric vs epoch, 95% band), ``recall_at_k.png`` (test Recall@K, 95% error bars),
``differences.png`` (paired differences vs the reference) and per method ``retrieval.png`` /
``worst_queries.png`` (:mod:`.retrieval`).

Fault isolation: a run that raises (crash, non-finite loss, a bad object) is recorded in
``RUN_DIR/failed.json`` and in the table; the other runs complete. Config errors are found
before the first run (:func:`check_configs`) and stop everything at once.
``--resume`` reuses finished runs (``metrics.json``), retries failed ones and re-summarizes:
:func:`summarize_dir` recomputes the tables from the run folders alone.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import csv
import json
import logging
import multiprocessing as mp
import re
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch
import tqdm

from . import distributed, registry, run_folder, runner, statistics
from .schema import (
    ConfigError,
    apply_set,
    expand_methods,
    load_config,
    load_yaml,
    parse_set,
    validate,
)

LOGGER = logging.getLogger(__name__)

METRIC_LABELS = {
    "precision_at_1": "P@1",
    "r_precision": "RP",
    "mean_average_precision_at_r": "MAP@R",
}
DEFAULT_PRIMARY = "mean_average_precision_at_r"
FAILED_FILE = "failed.json"


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", name).strip("_") or "method"


def metric_label(metric: str) -> str:
    if " " in metric:  # a further test entry's metric (see _test_metrics)
        entry, base = metric.rsplit(" ", 1)
        return f"{entry} {metric_label(base)}"
    if metric.startswith("recall_at_"):
        return "R@" + metric[len("recall_at_") :]
    return METRIC_LABELS.get(metric, metric)


# --------------------------------------------------------------------------- configs


def collect_methods(
    configs: Sequence[str | Path | Mapping],
    overrides: Iterable[str] = (),
    methods: Sequence[str] | None = None,
) -> dict[str, dict]:
    """``{method name: config}`` over all configs (``methods`` filters by name, in order).

    Each item of ``configs`` is a YAML path or a config dict (the content a YAML file would have,
    ``methods:`` included). Only the selected methods are validated, so a subset runs even where
    another method names a class that is not installed.
    """
    if isinstance(configs, (str, Path, Mapping)):
        configs = [configs]
    out: dict[str, dict] = {}
    sets = parse_set(overrides)
    for i, item in enumerate(configs):
        if isinstance(item, Mapping):
            where = f"config dict #{i}"
            expanded = expand_methods(copy.deepcopy(dict(item)), default_name=f"config{i}")
            for cfg in expanded.values():
                for p, v in sets:
                    apply_set(cfg, p, copy.deepcopy(v))
        else:
            where = str(item)
            expanded = load_config(item, overrides, check=False)
        for name, cfg in expanded.items():
            if name in out:
                raise ValueError(f"method {name!r} defined twice (in {where})")
            out[name] = cfg
    if methods:
        missing = [m for m in methods if m not in out]
        if missing:
            raise ValueError(f"--methods: unknown {missing}; have {list(out)}")
        out = {m: out[m] for m in methods}
    for cfg in out.values():
        validate(cfg)
    return out


def check_configs(configs: Mapping[str, dict]) -> None:
    """Fail fast: validate every config and construct its models, losses and miners on the CPU.

    Raises :class:`ConfigError` naming the method for any error a constructor raises (a bad
    ``num_bins``, a missing file named in a model...), before any run starts. Datasets are not
    built here (too slow); their class and keywords are checked by :func:`validate`.
    """
    from . import builder

    for name, cfg in configs.items():
        validate(cfg)
        try:
            builder.build_models(cfg, torch.device("cpu"))
            builder.build_losses_and_miners(cfg, torch.device("cpu"))
        except ConfigError as e:
            raise ConfigError(f"method {name!r}: {e}") from e
        except (TypeError, ValueError, KeyError, OSError) as e:
            raise ConfigError(f"method {name!r}: {type(e).__name__}: {e}") from e


# --------------------------------------------------------------------------- running


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
) -> dict:
    """Train every method with seeds ``seed, seed+1, ...``; write tables, plots and pictures.

    ``configs``: YAML paths and/or config dicts. ``reference``: the method the others are compared
    with (default: the first). ``jobs``: worker processes. With ``resume`` a finished run
    (``metrics.json`` present) is reused, an interrupted one continued and a failed one retried;
    otherwise a folder holding an earlier run is refused unless ``overwrite``. Returns the summary dict (see :func:`summarize`);
    ``summary["failed"]`` lists failed runs (the CLI then exits non-zero).
    """
    out_dir = Path(out_dir)
    selected = collect_methods(configs, overrides, methods)
    if reference is not None and reference not in selected:
        raise ValueError(f"--reference {reference!r}: not one of the methods {list(selected)}")
    check_configs(selected)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    all_jobs = make_jobs(selected, out_dir, seeds)
    results = execute(all_jobs, resume, device, jobs, desc="compare", overwrite=overwrite)
    primary = primary_metric(next(iter(selected.values())))
    summary = summarize(results, reference=reference, primary=primary)
    summary["total_wall_seconds"] = time.perf_counter() - t_all
    summary["seeds"] = seeds
    summary["jobs"] = jobs
    if distributed.is_main_process():  # under torchrun: rank 0 writes
        if pictures:
            summary["pictures"] = write_pictures(results, all_jobs, device)
        write_outputs(summary, results, out_dir)
    distributed.barrier()
    return summary


def primary_metric(config: dict) -> str:
    return str((config.get("eval") or {}).get("primary_metric") or DEFAULT_PRIMARY)


def write_pictures(results: dict, jobs: Sequence[Job], device: str | None) -> dict:
    """Retrieval pictures for the first successful run of each name, into ``<name>/``."""
    from . import retrieval

    out = {}
    for name, by_run in results.items():
        job = next(
            (j for j in jobs if j.name == name and not is_failed(by_run.get(j.run_id, {}))),
            None,
        )
        if job is None:
            continue
        try:
            paths = retrieval.write_retrieval_pictures(job.run_dir, job.run_dir.parent, device)
            out[name] = [str(p) for p in paths]
        except Exception as e:  # noqa: BLE001 -- pictures are a bonus; never lose the table
            LOGGER.warning("retrieval pictures for %s failed: %s: %s", name, type(e).__name__, e)
            out[name] = f"failed: {type(e).__name__}: {e}"
    return out


def write_outputs(summary: dict, results: dict, out_dir: Path, stem: str = "comparison") -> None:
    """``<stem>.md``, ``<stem>.csv``, ``summary.json`` and the plots."""
    label = summary.get("label", "method")
    (out_dir / f"{stem}.md").write_text(markdown_table(summary, label))
    write_csv(summary, out_dir / f"{stem}.csv", label)
    json_name = "summary.json" if stem == "comparison" else f"{stem}.json"
    (out_dir / json_name).write_text(json.dumps(summary, indent=2))
    write_plots(results, out_dir, summary)


# --------------------------------------------------------------------------- statistics


def is_failed(m: dict) -> bool:
    """A failure record of :func:`run_job` or a ``metrics.json`` the runner marked failed."""
    return bool(m.get("failed")) or m.get("status") == "failed"


def _test_metrics(m: dict) -> dict:
    """The first test entry's metrics as they are, every further entry's prefixed by its name
    (``"separated precision_at_1"`` for the MLRC protocol, whose first entry is
    ``concatenated``; ``"test1600 recall_at_1"`` for VehicleID's three test sets)."""
    test = m.get("test") or {}
    out: dict = {}
    for i, (entry, metrics) in enumerate(test.items()):
        out.update({(k if i == 0 else f"{entry} {k}"): v for k, v in metrics.items()})
    return out


def _metric_order(k: str):
    if " " in k:  # further test entries after the first entry's metrics, same order inside
        entry, base = k.rsplit(" ", 1)
        return (3, entry, _metric_order(base))
    fixed = list(METRIC_LABELS)
    if k in fixed:
        return (0, fixed.index(k), 0)
    if k.startswith("recall_at_"):
        return (1, 0, int(k[len("recall_at_") :]))
    return (2, 0, 0)


def summarize(
    results: Mapping[str, Mapping[str, dict]],
    reference: str | None = None,
    primary: str = DEFAULT_PRIMARY,
    label: str = "method",
) -> dict:
    """Statistics over ``results[name][run_id]`` (metrics.json contents or failure records).

    Returns ``{"metrics", "primary_metric", "reference", "confidence", "unit", "label",
    "run_ids", "rows": {name: {metric: {n, mean, std, ci_low, ci_high, ci_half_width, values,
    run_ids}, "seconds", "best_epoch", "n_runs", "n_failed", "failed"}}, "differences": {name:
    {metric: paired statistics vs the reference}}, "failed": [{name, run_id, error}]}``.
    Metric values are fractions (as PML reports them); the Markdown and CSV show percent.
    """
    metrics: list[str] = []
    run_ids: list[str] = []
    ok: dict[str, dict[str, dict]] = {}
    failed = []
    for name, by_run in results.items():
        ok[name] = {}
        for rid, m in by_run.items():
            if rid not in run_ids:
                run_ids.append(rid)
            if is_failed(m):
                failed.append({label: name, "run_id": rid, "error": m.get("error", "?")})
                continue
            ok[name][rid] = _test_metrics(m)
            for k in ok[name][rid]:
                if k not in metrics:
                    metrics.append(k)
    metrics.sort(key=_metric_order)
    if reference is not None and reference not in results:
        raise ValueError(f"reference {reference!r} is not one of {list(results)}")
    stats = statistics.describe_runs(ok, metrics, reference)
    rows = {}
    for name, by_run in results.items():
        row = dict(stats["stats"][name])
        good = [m for m in by_run.values() if not is_failed(m)]
        secs = [
            float(m.get("wall_seconds", m.get("train_seconds_this_call", np.nan))) for m in good
        ]
        row["seconds"] = {
            "mean": float(np.mean(secs)) if secs else None,
            "values": secs,
        }
        row["best_epoch"] = {
            rid: m.get("best", {}).get("epoch") for rid, m in by_run.items() if not is_failed(m)
        }
        row["n_runs"] = len(by_run)
        row["n_failed"] = len(by_run) - len(good)
        row["failed"] = {rid: m.get("error", "?") for rid, m in by_run.items() if is_failed(m)}
        rows[name] = row
    return {
        "label": label,
        "metrics": metrics,
        "primary_metric": primary,
        "reference": stats["reference"],
        "confidence": stats["confidence"],
        "unit": "fraction (0-1); the .md and .csv tables show percent",
        "run_ids": run_ids,
        "rows": rows,
        "differences": stats["differences"],
        "failed": failed,
    }


def load_run_dirs(out_dir: str | Path) -> dict[str, dict[str, dict]]:
    """``{name: {run_id: metrics or failure}}`` from ``OUT/<name>/<run_id>/`` folders alone.

    The name is the one recorded in ``metrics.json``/``failed.json`` (the folder is a slug);
    folders are read in the order of an existing ``summary.json`` when there is one.
    """
    out_dir = Path(out_dir)
    found: dict[str, dict[str, dict]] = {}
    for run_dir in sorted(p.parent for p in out_dir.glob("*/*/config.yaml")):
        if (run_dir / FAILED_FILE).exists():  # written after the runner's metrics.json
            m = json.loads((run_dir / FAILED_FILE).read_text())
        elif (run_dir / "metrics.json").exists():
            m = json.loads((run_dir / "metrics.json").read_text())
        else:
            continue  # interrupted: neither finished nor failed
        name = m.get("name") or run_dir.parent.name
        found.setdefault(name, {})[run_dir.name] = m
    for by_run in found.values():
        ordered = sorted(by_run, key=lambda r: (len(r), r))  # seed2 before seed10
        by_run_sorted = {r: by_run[r] for r in ordered}
        by_run.clear()
        by_run.update(by_run_sorted)
    order: list[str] = []
    for prev in ("summary.json", "sweep.json"):
        if (out_dir / prev).exists():
            order = list(json.loads((out_dir / prev).read_text()).get("rows", {}))
            break
    names = [n for n in order if n in found] + sorted(n for n in found if n not in order)
    return {n: found[n] for n in names}


def summarize_dir(out_dir: str | Path, reference: str | None = None, write: bool = True) -> dict:
    """Recompute the comparison tables of ``out_dir`` from its run folders (no training).

    Useful after changing the statistics or adding seeds: ``summarize_dir("runs/omniglot")``
    rewrites ``comparison.md``/``.csv``/``summary.json`` and the plots.
    """
    out_dir = Path(out_dir)
    results = load_run_dirs(out_dir)
    if not results:
        raise FileNotFoundError(f"{out_dir}: no finished or failed runs (*/seed*/metrics.json)")
    cfg_file = next(out_dir.glob("*/*/config.yaml"), None)
    primary = primary_metric(load_yaml(cfg_file)) if cfg_file else DEFAULT_PRIMARY
    summary = summarize(results, reference=reference, primary=primary)
    summary["seeds"] = max(len(r) for r in results.values())
    if write:
        write_outputs(summary, results, out_dir)
    return summary


# --------------------------------------------------------------------------- tables


def _n_cell(row: dict) -> str:
    n_ok = row["n_runs"] - row["n_failed"]
    return f"{n_ok}" + (f" ({row['n_failed']} failed)" if row["n_failed"] else "")


def markdown_table(summary: dict, label: str = "method") -> str:
    """Means with 95% CIs, then paired differences vs the reference, then failed runs."""
    metrics = summary["metrics"]
    primary = summary.get("primary_metric", DEFAULT_PRIMARY)
    head = [label, "n"] + [metric_label(m) for m in metrics] + ["time/run (s)"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * len(head)) + " |"]
    for name, row in summary["rows"].items():
        cells = [name, _n_cell(row)]
        if row["n_runs"] == row["n_failed"]:
            err = next(iter(row["failed"].values()), "?")
            cells += [f"failed: {_short(err)}"] + [""] * (len(metrics) - 1) + ["-"]
        else:
            cells += [statistics.format_mean_ci(row.get(m)) for m in metrics]
            secs = row["seconds"]["mean"]
            cells.append("-" if secs is None else f"{secs:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    seeds = summary.get("seeds")
    text = "\n".join(lines) + "\n\n"
    text += (
        "Test metrics in %, at the best validation epoch: mean ± half-width of the 95% confidence"
        f" interval (Student t) over n runs{f' (seeds, up to {seeds})' if seeds else ''}.\n"
    )
    ref = summary.get("reference")
    diffs = summary.get("differences") or {}
    if ref is not None and diffs:
        pl = metric_label(primary)
        head = [label, "n pairs"] + [f"Δ{metric_label(m)}" for m in metrics]
        head += [f"p t-test ({pl})", f"p Wilcoxon ({pl})", f"{pl} vs {ref}"]
        text += f"\nPaired differences vs **{ref}** (same seeds), in points of %:\n\n"
        text += "| " + " | ".join(head) + " |\n| " + " | ".join(["---"] * len(head)) + " |\n"
        for name, row in diffs.items():
            d = row.get(primary)
            cells = [name, str(d["n"]) if d else "0"]
            cells += [statistics.format_difference(row.get(m)) for m in metrics]
            cells += [
                statistics.format_p(d and d["p_ttest"]),
                statistics.format_p(d and d["p_wilcoxon"]),
                verdict(d),
            ]
            text += "| " + " | ".join(cells) + " |\n"
        text += (
            "\nΔ = method − reference, mean ± 95% CI half-width of the paired differences; `*`: the"
            " CI excludes 0. p: two-sided paired t-test (scipy.stats.ttest_rel) and Wilcoxon"
            " signed-rank test (only when n >= 6).\n"
        )
    if summary.get("failed"):
        text += "\nFailed runs:\n\n"
        for f in summary["failed"]:
            text += (
                f"- {f.get(label, f.get('method'))} / {f['run_id']}: {_short(f['error'], 300)}\n"
            )
    return text


def verdict(d: dict | None) -> str:
    """``higher``/``lower`` when the 95% CI of the paired difference excludes 0, else
    ``inconclusive`` (or ``n=1, no CI``)."""
    if not d:
        return "-"
    if d["ci_excludes_zero"] is None:
        return f"n={d['n']}, no CI"
    if not d["ci_excludes_zero"]:
        return "inconclusive"
    return "higher" if d["mean"] > 0 else "lower"


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _pct(x: Any) -> str:
    return "" if x is None else f"{100 * x:.6f}"


def _num(x: Any) -> str:
    return "" if x is None else f"{x:.6g}"


def csv_header(metrics: Sequence[str], label: str = "method") -> list[str]:
    cols = [label, "n_runs", "n_failed"]
    for m in metrics:
        cols += [
            f"{m}_mean_pct",
            f"{m}_std_pct",
            f"{m}_ci95_low_pct",
            f"{m}_ci95_high_pct",
            f"{m}_ci95_half_width_pct",
            f"{m}_diff_vs_reference_pct",
            f"{m}_diff_ci95_low_pct",
            f"{m}_diff_ci95_high_pct",
            f"{m}_diff_n_pairs",
            f"{m}_diff_p_ttest",
            f"{m}_diff_p_wilcoxon",
        ]
    return cols + ["reference", "seconds_per_run", "errors"]


def write_csv(summary: dict, path: Path, label: str = "method") -> None:
    """One row per method; metric columns in percent (``_pct``), p-values as fractions."""
    metrics = summary["metrics"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(csv_header(metrics, label))
        for name, row in summary["rows"].items():
            d_row = (summary.get("differences") or {}).get(name, {})
            cells = [name, row["n_runs"], row["n_failed"]]
            for m in metrics:
                st = row.get(m) or {}
                d = d_row.get(m) or {}
                cells += [
                    _pct(st.get("mean")),
                    _pct(st.get("std")),
                    _pct(st.get("ci_low")),
                    _pct(st.get("ci_high")),
                    _pct(st.get("ci_half_width")),
                    _pct(d.get("mean")),
                    _pct(d.get("ci_low")),
                    _pct(d.get("ci_high")),
                    d.get("n", ""),
                    _num(d.get("p_ttest")),
                    _num(d.get("p_wilcoxon")),
                ]
            secs = row["seconds"]["mean"]
            errors = "; ".join(f"{r}: {e}" for r, e in row["failed"].items())
            cells += [summary.get("reference") or "", "" if secs is None else f"{secs:.2f}", errors]
            w.writerow(cells)


# --------------------------------------------------------------------------- plots


def _band(values: Sequence[float]) -> tuple[float, float]:
    """(mean, 95% CI half-width or 0 for one value) -- for plotting only."""
    st = statistics.t_interval(values)
    return st["mean"], st["ci_half_width"] or 0.0


def write_plots(results: dict, out_dir: Path, summary: dict | None = None) -> list[Path]:
    """``val_map_at_r.png`` (validation primary metric vs epoch, mean with a 95% band),
    ``recall_at_k.png`` (test Recall@K, 95% error bars) and ``differences.png`` (paired
    differences of the test primary metric vs the reference, 95% CIs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    primary = (summary or {}).get("primary_metric", DEFAULT_PRIMARY)
    ok = {
        name: [m for m in by_run.values() if not is_failed(m)] for name, by_run in results.items()
    }
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, runs in ok.items():
        series: dict[int, list[float]] = {}
        for r in runs:
            for h in r.get("history", []):
                val = h.get("validation") or {}
                if val:
                    v = next(iter(val.values())).get(primary)
                    if v is not None:
                        series.setdefault(h["epoch"], []).append(v)
        if series:
            ep = sorted(series)
            mean_half = np.array([_band(series[e]) for e in ep]) * 100
            (line,) = ax.plot(ep, mean_half[:, 0], marker="o", label=method)
            ax.fill_between(
                ep,
                mean_half[:, 0] - mean_half[:, 1],
                mean_half[:, 0] + mean_half[:, 1],
                color=line.get_color(),
                alpha=0.15,
            )
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"validation {metric_label(primary)} (%), mean, 95% band")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    name = "val_map_at_r.png" if primary == DEFAULT_PRIMARY else f"val_{slug(primary)}.png"
    paths.append(out_dir / name)
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    all_ks: set[int] = {1}
    n_methods = max(1, len(ok))
    for j, (method, runs) in enumerate(ok.items()):
        ks = sorted(
            {
                int(k[len("recall_at_") :])
                for r in runs
                for k in _test_metrics(r)
                if k.startswith("recall_at_")
            }
        )
        if not ks:
            continue
        all_ks.update(ks)
        mh = np.array(
            [
                _band(
                    [
                        _test_metrics(r)[f"recall_at_{k}"]
                        for r in runs
                        if f"recall_at_{k}" in _test_metrics(r)
                    ]
                )
                for k in ks
            ]
        )
        # Small horizontal offsets so that overlapping error bars stay readable.
        xs = np.array(ks, dtype=float) * 2 ** (0.06 * (j - (n_methods - 1) / 2))
        ax.errorbar(xs, 100 * mh[:, 0], yerr=100 * mh[:, 1], marker="o", capsize=2, label=method)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(sorted(all_ks)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("K")
    ax.set_ylabel("test Recall@K (%), mean, 95% CI")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "recall_at_k.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    diffs = (summary or {}).get("differences") or {}
    rows = [(n, d[primary]) for n, d in diffs.items() if d.get(primary)]
    if rows:
        fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.5))
        y = np.arange(len(rows))[::-1]
        means = [100 * d["mean"] for _, d in rows]
        errs = [100 * (d["ci_half_width"] or 0.0) for _, d in rows]
        colors = ["C2" if d["ci_excludes_zero"] else "C7" for _, d in rows]
        for yi, m, e, c, (_, d) in zip(y, means, errs, colors, rows):
            ax.errorbar(m, yi, xerr=e if d["ci_half_width"] else None, fmt="o", color=c, capsize=3)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(y)
        ax.set_yticklabels([n for n, _ in rows], fontsize=8)
        ax.set_xlabel(
            f"test {metric_label(primary)} − {summary['reference']} (points), paired, 95% CI"
        )
        ax.grid(alpha=0.3, axis="x")
        fig.tight_layout()
        paths.append(out_dir / "differences.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths
