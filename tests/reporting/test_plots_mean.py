"""The plotted curves are the mean over each method's runs, with the 95% Student-t band / error
bars around it (not one run's values): the validation curve per epoch and Recall@K per K, checked
against numpy/scipy on synthetic runs whose seeds differ."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from pml_rank_plugins.reporting import plots
from pml_rank_plugins.reporting.summary import summarize
from tests.reporting.synthetic import synthetic_results

MAPR = "mean_average_precision_at_r"
KS = (1, 2, 4)


def runs_with_varying_recall() -> dict:
    results = synthetic_results(seeds=4)
    for j, by_run in enumerate(results.values()):
        for s, run in enumerate(by_run.values()):
            for k in KS:
                run["test"]["test"][f"recall_at_{k}"] = 0.5 + 0.05 * k + 0.04 * s - 0.01 * j
    return results


def mean_and_half(values) -> tuple[float, float]:
    values = np.asarray(values, dtype=float)
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    return 100 * values.mean(), 100 * half


def data_line(ax, label):
    lines = {line.get_label(): line for line in ax.get_lines()}
    lines.update({c.get_label(): c.lines[0] for c in ax.containers})
    return lines[label]


def test_validation_curve_is_the_mean_over_runs_with_its_band():
    results = runs_with_varying_recall()
    ax = plots.validation_figure(results, summarize(results)).axes[0]
    bands = iter(ax.collections)  # one fill_between per method, in the legend's order
    for name, by_run in results.items():
        epochs = [h["epoch"] for h in next(iter(by_run.values()))["history"]]
        per_epoch = [
            [r["history"][e - 1]["validation"]["val"][MAPR] for r in by_run.values()]
            for e in epochs
        ]
        assert np.ptp(per_epoch[-1]) > 0.5e-2  # the seeds differ: the first run is not the mean
        line = data_line(ax, name)
        assert list(line.get_xdata()) == epochs
        want = [mean_and_half(v) for v in per_epoch]
        np.testing.assert_allclose(line.get_ydata(), [m for m, _ in want], rtol=1e-12)
        vertices = next(bands).get_paths()[0].vertices
        for e, (m, h) in zip(epochs, want):
            ys = vertices[np.isclose(vertices[:, 0], e)][:, 1]
            assert ys.min() == pytest.approx(m - h) and ys.max() == pytest.approx(m + h)


def test_recall_points_are_the_mean_over_runs_with_their_error_bars():
    results = runs_with_varying_recall()
    ax = plots.recall_figure(results).axes[0]
    for name, by_run in results.items():
        container = next(c for c in ax.containers if c.get_label() == name)
        want = [
            mean_and_half([r["test"]["test"][f"recall_at_{k}"] for r in by_run.values()])
            for k in KS
        ]
        np.testing.assert_allclose(container.lines[0].get_ydata(), [m for m, _ in want])
        (bars,) = container.lines[2]
        for segment, (m, h) in zip(bars.get_segments(), want):
            assert segment[:, 1].min() == pytest.approx(m - h)
            assert segment[:, 1].max() == pytest.approx(m + h)
