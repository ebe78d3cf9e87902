"""The comparison plots: ``val_map_at_r.png`` (validation primary metric vs epoch, 95% band),
``recall_at_k.png`` (test Recall@K, 95% error bars) and ``differences.png`` (paired differences
against the reference method, 95% CIs). matplotlib is imported when a plot is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..experiment.methods import slug
from ..running.pool import is_failed
from . import statistics
from .tables import DEFAULT_PRIMARY, metric_label, test_metrics


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
                for k in test_metrics(r)
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
                        test_metrics(r)[f"recall_at_{k}"]
                        for r in runs
                        if f"recall_at_{k}" in test_metrics(r)
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
