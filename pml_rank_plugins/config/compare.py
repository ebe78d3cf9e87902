"""Side-by-side comparison: several methods x several seeds -> Markdown/CSV table and plots.

Every (method, seed) is an ordinary :func:`runner.train` run in ``OUT/<method>/seed<i>``; the
table reports mean +- std over seeds of the *test* metrics (at the best validation epoch), in
percent, plus the wall time per run. Plots: validation primary metric (MAP@R) vs epoch per method
(mean over seeds) and test Recall@K vs K per method.
"""

from __future__ import annotations

import copy
import csv
import json
import re
import shutil
import time
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import tqdm

from . import distributed, runner
from .schema import load_config, validate

METRIC_LABELS = {
    "precision_at_1": "P@1",
    "r_precision": "RP",
    "mean_average_precision_at_r": "MAP@R",
}


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", name).strip("_") or "method"


def metric_label(metric: str) -> str:
    if metric.startswith("recall_at_"):
        return "R@" + metric[len("recall_at_") :]
    return METRIC_LABELS.get(metric, metric)


def collect_methods(
    config_paths: Sequence[str | Path],
    overrides: Iterable[str] = (),
    methods: Sequence[str] | None = None,
) -> dict[str, dict]:
    """``{method name: config}`` over all files (``methods`` filters by name, in file order).

    Only the selected methods are validated, so a subset runs even where another method names a
    class that is not installed.
    """
    out: dict[str, dict] = {}
    for path in config_paths:
        for name, cfg in load_config(path, overrides, check=False).items():
            if name in out:
                raise ValueError(f"method {name!r} defined twice (in {path})")
            out[name] = cfg
    if methods:
        missing = [m for m in methods if m not in out]
        if missing:
            raise ValueError(f"--methods: unknown {missing}; have {list(out)}")
        out = {m: out[m] for m in methods}
    for cfg in out.values():
        validate(cfg)
    return out


def run_comparison(
    config_paths: Sequence[str | Path],
    out_dir: str | Path,
    seeds: int = 1,
    overrides: Iterable[str] = (),
    methods: Sequence[str] | None = None,
    resume: bool = False,
    device: str | None = None,
) -> dict:
    """Train every method with seeds ``seed, seed+1, ...``; write table + CSV + plots.

    With ``resume`` a finished run (``metrics.json`` present) is reused and an interrupted one is
    continued; otherwise every run directory starts empty. Returns the summary dict.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    configs = collect_methods(config_paths, overrides, methods)
    results: dict[str, list[dict]] = {}
    jobs = [(m, s) for m in configs for s in range(seeds)]
    t_all = time.perf_counter()
    for method, i in tqdm.tqdm(jobs, desc="compare", unit="run"):
        cfg = copy.deepcopy(configs[method])
        cfg["seed"] = int(cfg.get("seed", 0)) + i
        cfg["name"] = method
        run_dir = out_dir / slug(method) / f"seed{i}"
        done = run_dir / "metrics.json"
        t0 = time.perf_counter()
        if resume and done.exists():
            metrics = json.loads(done.read_text())
        else:
            if not resume and run_dir.exists() and distributed.is_main_process():
                shutil.rmtree(run_dir)
            distributed.barrier()  # under torchrun: every rank trains, rank 0 writes
            metrics = runner.train(cfg, run_dir, resume=resume, device=device)
            metrics["wall_seconds"] = time.perf_counter() - t0
            if distributed.is_main_process():
                done.write_text(json.dumps(metrics, indent=2))
        results.setdefault(method, []).append(metrics)
    summary = summarize(results)
    summary["total_wall_seconds"] = time.perf_counter() - t_all
    summary["seeds"] = seeds
    if distributed.is_main_process():
        write_table(summary, out_dir)
        write_plots(results, out_dir)
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    distributed.barrier()
    return summary


def _test_metrics(m: dict) -> dict:
    test = m.get("test") or {}
    return next(iter(test.values())) if test else {}


def summarize(results: dict[str, list[dict]]) -> dict:
    """Mean/std over seeds of each test metric per method (std with ddof=1; 0 for one seed)."""
    metrics: list[str] = []
    for runs in results.values():
        for r in runs:
            for k in _test_metrics(r):
                if k not in metrics:
                    metrics.append(k)
    metrics.sort(key=_metric_order)
    rows = {}
    for method, runs in results.items():
        row = {}
        for k in metrics:
            vals = np.array([_test_metrics(r).get(k, np.nan) for r in runs], dtype=float)
            row[k] = {
                "mean": float(np.mean(vals)),
                "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0,
                "values": vals.tolist(),
            }
        secs = [r.get("wall_seconds", r.get("train_seconds_this_call", np.nan)) for r in runs]
        row["seconds"] = {"mean": float(np.mean(secs)), "values": [float(s) for s in secs]}
        row["best_epoch"] = [r.get("best", {}).get("epoch") for r in runs]
        rows[method] = row
    return {"metrics": metrics, "rows": rows}


def _metric_order(k: str):
    fixed = list(METRIC_LABELS)
    if k in fixed:
        return (0, fixed.index(k), 0)
    if k.startswith("recall_at_"):
        return (1, 0, int(k[len("recall_at_") :]))
    return (2, 0, 0)


def markdown_table(summary: dict) -> str:
    metrics = summary["metrics"]
    head = ["method"] + [metric_label(m) for m in metrics] + ["time/run (s)"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * len(head)) + " |"]
    for method, row in summary["rows"].items():
        cells = [method]
        for m in metrics:
            cells.append(f"{100 * row[m]['mean']:.2f} +- {100 * row[m]['std']:.2f}")
        cells.append(f"{row['seconds']['mean']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    n = summary.get("seeds")
    note = f"\nTest metrics in %, mean +- std over {n} seed(s), at the best validation epoch.\n"
    return "\n".join(lines) + "\n" + (note if n else "")


def write_table(summary: dict, out_dir: Path) -> None:
    (out_dir / "comparison.md").write_text(markdown_table(summary))
    with open(out_dir / "comparison.csv", "w", newline="") as f:
        w = csv.writer(f)
        metrics = summary["metrics"]
        w.writerow(
            ["method"]
            + [f"{m}_{s}" for m in metrics for s in ("mean", "std")]
            + ["seconds_per_run", "n_seeds"]
        )
        for method, row in summary["rows"].items():
            w.writerow(
                [method]
                + [f"{row[m][s]:.6f}" for m in metrics for s in ("mean", "std")]
                + [f"{row['seconds']['mean']:.2f}", len(row["seconds"]["values"])]
            )


def write_plots(results: dict[str, list[dict]], out_dir: Path) -> list[Path]:
    """``val_map_at_r.png`` (validation primary metric vs epoch) and ``recall_at_k.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, runs in results.items():
        series: dict[int, list[float]] = {}
        for r in runs:
            for h in r.get("history", []):
                val = h.get("validation") or {}
                if val:
                    v = next(iter(val.values())).get("mean_average_precision_at_r")
                    if v is not None:
                        series.setdefault(h["epoch"], []).append(v)
        if series:
            ep = sorted(series)
            ax.plot(ep, [100 * np.mean(series[e]) for e in ep], marker="o", label=method)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation MAP@R (%), mean over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "val_map_at_r.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    all_ks: set[int] = {1}
    for method, runs in results.items():
        ks = sorted(
            {
                int(k[len("recall_at_") :])
                for r in runs
                for k in _test_metrics(r)
                if "recall_at_" in k
            }
        )
        if not ks:
            continue
        all_ks.update(ks)
        vals = [
            100 * np.mean([_test_metrics(r).get(f"recall_at_{k}", np.nan) for r in runs])
            for k in ks
        ]
        ax.plot(ks, vals, marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(sorted(all_ks)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("K")
    ax.set_ylabel("test Recall@K (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "recall_at_k.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
