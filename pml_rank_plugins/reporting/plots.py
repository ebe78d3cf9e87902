"""The comparison plots, each a PNG with a PDF copy next to it (:mod:`.style`):

* ``val_map_at_r.png``: the validation primary metric vs epoch, mean over runs with a 95% band;
  one colour and marker per loss family, plugin solid and PML dashed (:func:`.style.method_styles`).
* ``recall_at_k.png``: test Recall@K vs K, mean with 95% error bars, the same styles.
* ``differences.png``: paired differences of the test primary metric against the reference with
  95% CIs, coloured and marked by direction (better / worse / inconclusive).

``*_figure`` build and return the :class:`matplotlib.figure.Figure` (inspectable without reading a
file back); :func:`write_plots` saves them. matplotlib is imported when a plot is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..experiment.methods import slug
from ..running.pool import is_failed, is_refused
from . import statistics, style
from .tables import DEFAULT_PRIMARY, evaluated_on, metric_label, split_title, test_metrics

if TYPE_CHECKING:  # type hints only; matplotlib is imported lazily
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

LEGEND_TITLE = "line: plugin solid, PML dashed"


def _band(values: Sequence[float]) -> tuple[float, float]:
    """(mean, 95% CI half-width or 0 for one value) -- for plotting only."""
    st = statistics.t_interval(values)
    return st["mean"], st["ci_half_width"] or 0.0


def _ok_runs(results: dict) -> dict[str, list[dict]]:
    return {
        name: [m for m in by_run.values() if not is_failed(m) and not is_refused(m)]
        for name, by_run in results.items()
    }


def _legend(ax: "Axes", names: Sequence[str]) -> None:
    """The legend right of the axes (eight methods would hide the curves inside them)."""
    has_impl = any(style.method_family(n)[1] for n in names)
    ax.legend(
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
        fontsize=style.FONT_RC["legend.fontsize"],
        title=LEGEND_TITLE if has_impl else None,
        title_fontsize=style.FONT_RC["legend.title_fontsize"],
    )


def _no_data(ax: "Axes", what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes, fontsize=11)


def validation_figure(results: dict, summary: dict | None = None) -> "Figure":
    """The validation primary metric vs epoch: mean over each method's runs with a 95% band.

    Args:
        results: ``{name: {run_id: metrics.json contents or failure record}}``.
        summary: the comparison summary (its ``primary_metric``; default MAP@R).

    Returns:
        The figure (one axes, titled, labelled, with a legend when a method has a history).
    """
    import matplotlib.ticker

    primary = (summary or {}).get("primary_metric", DEFAULT_PRIMARY)
    ok = _ok_runs(results)
    styles = style.method_styles(ok)
    fig = style.new_figure(9, 4.8)
    ax = fig.add_subplot()
    plotted = []
    for method, runs in ok.items():
        series: dict[int, list[float]] = {}
        for r in runs:
            for h in r.get("history", []):
                val = h.get("validation") or {}
                v = next(iter(val.values())).get(primary) if val else None
                if v is not None:
                    series.setdefault(h["epoch"], []).append(v)
        if not series:
            continue
        ep = sorted(series)
        mean_half = np.array([_band(series[e]) for e in ep]) * 100
        # Clipped to the metric's range: with 2 seeds (t = 12.7) a band can span -50..150%
        # and squash every curve into a flat line.
        lo = np.clip(mean_half[:, 0] - mean_half[:, 1], 0.0, 100.0)
        hi = np.clip(mean_half[:, 0] + mean_half[:, 1], 0.0, 100.0)
        ax.plot(ep, mean_half[:, 0], label=method, linewidth=1.8, markersize=6, **styles[method])
        ax.fill_between(ep, lo, hi, color=styles[method]["color"], alpha=0.10, linewidth=0)
        plotted.append(method)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    label = metric_label(primary)
    style.label_axes(
        ax,
        f"Validation {label} per epoch (mean over runs, 95% band)",
        "epoch",
        f"validation {label} (%)",
    )
    if plotted:
        _legend(ax, plotted)
    else:
        _no_data(ax, "validation history")
    return fig


def recall_figure(results: dict) -> "Figure":
    """Test Recall@K vs K (log2 axis): mean over each method's runs with 95% error bars.

    Args:
        results: ``{name: {run_id: metrics.json contents or failure record}}``.

    Returns:
        The figure (one axes, titled, labelled, with a legend when a method has Recall@K).
    """
    import matplotlib.ticker

    ok = _ok_runs(results)
    styles = style.method_styles(ok)
    fig = style.new_figure(9, 4.8)
    ax = fig.add_subplot()
    all_ks: set[int] = {1}
    n_methods = max(1, len(ok))
    plotted = []
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
        mean, half = 100 * mh[:, 0], 100 * mh[:, 1]
        # Bars clipped to 0..100% (a recall cannot leave it; 2 seeds give t = 12.7).
        yerr = np.stack([np.minimum(half, mean), np.minimum(half, 100.0 - mean)])
        ax.errorbar(
            xs,
            mean,
            yerr=yerr,
            capsize=3,
            linewidth=1.5,
            markersize=6,
            label=method,
            **styles[method],
        )
        plotted.append(method)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(sorted(all_ks)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    where = split_title({"evaluated_on": evaluated_on(r for runs in ok.values() for r in runs)})
    style.label_axes(
        ax, f"{where} Recall@K (mean over runs, 95% CI)", "K", f"{where.lower()} Recall@K (%)"
    )
    if plotted:
        _legend(ax, plotted)
    else:
        _no_data(ax, "Recall@K in the test metrics")
    return fig


def differences_figure(summary: dict) -> "Figure | None":
    """Paired differences of the test primary metric vs the reference, one row per method, with
    95% CIs, coloured and marked by direction (:func:`.style.direction`).

    Args:
        summary: the comparison summary (``differences``, ``reference``, ``primary_metric``).

    Returns:
        The figure, or ``None`` when there is no paired difference to show.
    """
    from matplotlib.lines import Line2D

    primary = summary.get("primary_metric", DEFAULT_PRIMARY)
    diffs = summary.get("differences") or {}
    rows = [(n, d[primary]) for n, d in diffs.items() if d.get(primary)]
    if not rows:
        return None
    fig = style.new_figure(9, 0.45 * len(rows) + 2.2)
    ax = fig.add_subplot()
    y = np.arange(len(rows))[::-1]
    seen = []
    for yi, (_, d) in zip(y, rows):
        kind = style.direction(d)
        color, marker, _ = style.DIRECTIONS[kind]
        err = 100 * d["ci_half_width"] if d["ci_half_width"] else None
        ax.errorbar(
            100 * d["mean"], yi, xerr=err, fmt=marker, color=color, markersize=8, capsize=4, lw=1.8
        )
        seen.append(kind)
    ax.axvline(0, color="k", lw=0.9)
    ax.set_yticks(y)
    ax.set_yticklabels([n for n, _ in rows])
    label = metric_label(primary)
    ref = summary.get("reference")
    style.label_axes(
        ax,
        f"{split_title(summary)} {label}: paired difference vs {ref} (95% CI)",
        f"{label} of method − {label} of {ref} (points of %)",
        "method",
    )
    ax.grid(False, axis="y")
    keys = ["better", "worse", "inconclusive"] + (["no CI"] if "no CI" in seen else [])
    handles = [
        Line2D([], [], color=style.DIRECTIONS[k][0], marker=style.DIRECTIONS[k][1], ls="", ms=8)
        for k in keys
    ]
    ax.legend(
        handles,
        [style.DIRECTIONS[k][2] for k in keys],
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
        fontsize=style.FONT_RC["legend.fontsize"],
    )
    return fig


def write_plots(results: dict, out_dir: Path, summary: dict | None = None) -> list[Path]:
    """Save ``val_map_at_r`` (``val_<metric>`` for another primary metric), ``recall_at_k`` and,
    with paired differences in ``summary``, ``differences`` -- each as PNG and PDF.

    Args:
        results: ``{name: {run_id: metrics.json contents or failure record}}``.
        out_dir: the folder written to.
        summary: the comparison summary (primary metric, reference, differences).

    Returns:
        The paths written, each PNG followed by its PDF.
    """
    out_dir = Path(out_dir)
    primary = (summary or {}).get("primary_metric", DEFAULT_PRIMARY)
    name = "val_map_at_r.png" if primary == DEFAULT_PRIMARY else f"val_{slug(primary)}.png"
    paths = style.save_figure(validation_figure(results, summary), out_dir / name)
    paths += style.save_figure(recall_figure(results), out_dir / "recall_at_k.png")
    fig = differences_figure(summary or {})
    if fig is not None:
        paths += style.save_figure(fig, out_dir / "differences.png")
    return paths
