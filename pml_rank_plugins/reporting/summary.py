"""Summary statistics of many runs: ``{name: {run_id: metrics}}`` -> rows with 95% CIs and paired
differences against a reference, and the outputs written from them.

Runs of different methods with the same seed are *paired* (same data order, same initial weights
where the model config is shared). :func:`summarize` reports, per method and test metric (at the
best validation epoch), mean, 95% CI (Student t) and, against the reference, the paired
difference with its CI, paired t-test and (n >= 6) Wilcoxon p-values, raw and Holm-adjusted
over the table's rows, and the minimum detectable difference at 80% power; on the primary metric
also the TOST equivalence test when a margin is given (the config's
``compare.equivalence_margin``) and the verdict (:mod:`.statistics`, :func:`.tables.verdict`).
:func:`summarize_dir` recomputes everything from the run folders alone (the primary metric and
the margin from the first method's saved ``config.yaml``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

import numpy as np

from ..experiment.methods import slug
from ..experiment.schema import equivalence_margin
from ..experiment.spec import EvalSettings, read_run_config
from ..running.pool import FAILED_FILE, is_failed, is_refused
from . import statistics
from .plots import write_plots
from .tables import (
    DEFAULT_PRIMARY,
    evaluated_on,
    markdown_table,
    metric_order,
    test_metrics,
    verdict,
    write_csv,
)


def primary_metric(config: dict) -> str:
    """The config's ``eval.primary_metric`` (default MAP@R)."""
    return EvalSettings.parse(config).primary_metric


def write_outputs(summary: dict, results: dict, out_dir: Path, stem: str = "comparison") -> None:
    """``<stem>.md``, ``<stem>.csv``, ``summary.json`` and the plots."""
    label = summary.get("label", "method")
    (out_dir / f"{stem}.md").write_text(markdown_table(summary, label))
    write_csv(summary, out_dir / f"{stem}.csv", label)
    json_name = "summary.json" if stem == "comparison" else f"{stem}.json"
    (out_dir / json_name).write_text(json.dumps(summary, indent=2))
    write_plots(results, out_dir, summary)


def read_commands(path: Path) -> list[dict]:
    """The commands that wrote the summary at ``path`` (a comparison's ``summary.json``, a sweep's
    ``sweep.json``) before, ``summary["commands"]``, for a ``--resume`` to add itself to. A
    summary written before the list existed counts as one command with its
    ``total_wall_seconds`` / ``pictures_seconds``; no summary: none."""
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    if "commands" in old:
        return list(old["commands"])
    if "total_wall_seconds" not in old:
        return []
    keys = ("total_wall_seconds", "pictures_seconds", "jobs")
    return [{k: old[k] for k in keys if k in old}]


def add_command(summary: dict, previous: Path | None, jobs: int) -> None:
    """Record this command in ``summary["commands"]`` after those of the summary file
    ``previous`` (:func:`read_commands`; ``None``: a fresh record, not resuming), and make
    ``total_wall_seconds`` / ``pictures_seconds`` their sums: a ``--resume`` (one that trains
    the rest of an interrupted comparison, or nothing) adds its own seconds to the record instead
    of replacing the wall time of the commands that trained the runs. A command that drew no
    pictures spent 0 s on them; one whose picture time was not recorded (a summary written
    before it was) makes the sum unknown, and ``pictures_seconds`` is then left out."""
    this = {
        "total_wall_seconds": summary["total_wall_seconds"],
        "pictures_seconds": summary.get("pictures_seconds", 0.0),
        "jobs": jobs,
    }
    commands = (read_commands(previous) if previous is not None else []) + [this]
    summary["commands"] = commands
    summary["total_wall_seconds"] = sum(c["total_wall_seconds"] for c in commands)
    summary.pop("pictures_seconds", None)
    if all("pictures_seconds" in c for c in commands):
        summary["pictures_seconds"] = sum(c["pictures_seconds"] for c in commands)


def summarize(
    results: Mapping[str, Mapping[str, dict]],
    reference: str | None = None,
    primary: str = DEFAULT_PRIMARY,
    label: str = "method",
    margin: float | None = None,
) -> dict:
    """Statistics over ``results[name][run_id]`` (metrics.json contents or failure records).

    Returns ``{"metrics", "primary_metric", "equivalence_margin", "reference", "confidence",
    "alpha", "power", "unit", "label", "run_ids", "rows": {name: {metric: {n, mean, std, ci_low,
    ci_high, ci_half_width, values, run_ids}, "seconds", "best_epoch", "n_runs", "n_failed",
    "failed"}}, "differences": {name: {metric: paired statistics vs the reference (p-values raw
    and ``_holm``, ``mdd``; on the primary metric ``p_tost*`` with a margin, and
    ``verdict``)}}, "failed": [{name, run_id, error}]}``. ``margin``: the equivalence margin in
    points of the primary metric (``experiment.schema.equivalence_margin`` of the config), or None
    for no TOST. Metric values are fractions (as PML reports them); the Markdown and CSV show
    percent.
    """
    metrics: list[str] = []
    run_ids: list[str] = []
    ok: dict[str, dict[str, dict]] = {}
    failed = []
    refused = []
    for name, by_run in results.items():
        ok[name] = {}
        for rid, m in by_run.items():
            if rid not in run_ids:
                run_ids.append(rid)
            if is_refused(m):  # never started: neither a result nor a failure
                refused.append({label: name, "run_id": rid, "error": m.get("error", "?")})
                continue
            if is_failed(m):
                failed.append({label: name, "run_id": rid, "error": m.get("error", "?")})
                continue
            ok[name][rid] = test_metrics(m)
            for k in ok[name][rid]:
                if k not in metrics:
                    metrics.append(k)
    metrics.sort(key=metric_order)
    if reference is not None and reference not in results:
        raise ValueError(f"reference {reference!r} is not one of {list(results)}")
    if margin is not None:  # the same check as the config's (ConfigError naming the key)
        margin = equivalence_margin({"compare": {"equivalence_margin": margin}})
    # TOST needs the primary metric among the measured ones (not so when every run failed).
    equivalence = {primary: margin / 100} if margin is not None and primary in metrics else None
    stats = statistics.describe_runs(ok, metrics, reference, equivalence)
    for row in stats["differences"].values():
        if primary in row:
            row[primary]["verdict"] = verdict(row[primary], margin)
    rows = {}
    for name, by_run in results.items():
        row = dict(stats["stats"][name])
        good = [m for m in by_run.values() if not is_failed(m) and not is_refused(m)]
        secs = [
            float(m.get("wall_seconds", m.get("train_seconds_this_call", np.nan))) for m in good
        ]
        row["seconds"] = {
            "mean": float(np.mean(secs)) if secs else None,
            "values": secs,
        }
        row["best_epoch"] = {
            rid: m.get("best", {}).get("epoch")
            for rid, m in by_run.items()
            if not is_failed(m) and not is_refused(m)
        }
        row["n_runs"] = len(by_run)
        row["n_refused"] = sum(is_refused(m) for m in by_run.values())
        row["n_failed"] = len(by_run) - len(good) - row["n_refused"]
        row["failed"] = {rid: m.get("error", "?") for rid, m in by_run.items() if is_failed(m)}
        row["refused"] = {rid: m.get("error", "?") for rid, m in by_run.items() if is_refused(m)}
        rows[name] = row
    return {
        "label": label,
        # where the numbers come from: a config without eval.test reports validation
        "evaluated_on": evaluated_on(
            m
            for by_run in results.values()
            for m in by_run.values()
            if not is_failed(m) and not is_refused(m)
        ),
        "metrics": metrics,
        "primary_metric": primary,
        "equivalence_margin": margin,
        "reference": stats["reference"],
        "confidence": stats["confidence"],
        "alpha": stats["alpha"],
        "power": stats["power"],
        "multiple_comparisons": (
            "Holm, per metric over the rows' comparisons against the reference; t-test,"
            " Wilcoxon and TOST p-values are separate families"
        ),
        "unit": "fraction (0-1); the .md and .csv tables show percent",
        "run_ids": run_ids,
        "rows": rows,
        "differences": stats["differences"],
        "failed": failed,
        "refused": refused,
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
        ordered = sorted(by_run, key=lambda r: (len(r), r))  # seed2 before seed10, as _run_order
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
    rewrites ``comparison.md``/``.csv``/``summary.json`` and the plots. What only the command
    that trained the runs knew (``total_wall_seconds``, ``jobs``, ``tuned_from``, ``pictures``,
    ...: every key of an existing ``summary.json`` that the statistics do not produce) is kept. The primary metric and
    the equivalence margin come from the saved ``config.yaml`` of the first method's first run
    (as ``compare`` takes them from the first method's config).
    """
    out_dir = Path(out_dir)
    results = load_run_dirs(out_dir)
    if not results:
        raise FileNotFoundError(f"{out_dir}: no finished or failed runs (*/seed*/metrics.json)")
    config = _first_config(out_dir, next(iter(results)))
    primary = primary_metric(config) if config else DEFAULT_PRIMARY
    margin = equivalence_margin(config) if config else None
    summary = summarize(results, reference=reference, primary=primary, margin=margin)
    summary["seeds"] = max(len(r) for r in results.values())
    previous = out_dir / "summary.json"
    if previous.exists():  # keep the command's record (wall time, jobs, tuned_from, pictures...)
        old = json.loads(previous.read_text())
        summary.update({k: v for k, v in old.items() if k not in summary})
    if write:
        write_outputs(summary, results, out_dir)
    return summary


def _first_config(out_dir: Path, name: str) -> dict | None:
    """The saved config of ``name``'s first run folder (the lowest seed: ``OUT/<slug>/seed0``...;
    any run's when that folder has none)."""
    files = sorted((out_dir / slug(name)).glob("*/config.yaml"), key=lambda p: _run_order(p.parent))
    files = files or sorted(out_dir.glob("*/*/config.yaml"))
    return read_run_config(files[0].parent) if files else None


def _run_order(run_dir: Path) -> tuple:
    return (len(run_dir.name), run_dir.name)  # seed2 before seed10
