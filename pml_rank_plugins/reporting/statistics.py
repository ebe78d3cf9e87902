"""Statistics for comparisons and sweeps: t intervals per method, paired tests between methods.

A *run* is one training run of one method, identified by a run id (``seed0``, ``seed1``, ... or
``fold0/seed0``); methods are compared on the runs they share (same seed, same fold), so the
seed-to-seed noise that every method sees alike cancels in the differences.

Per method and metric (values ``x_1..x_n``):

* mean ``m``, standard deviation ``s`` (``ddof=1``), ``n``;
* 95% confidence interval ``m +- t_{0.975, n-1} s / sqrt(n)`` (Student t, ``scipy.stats.t``);
  undefined (``None``) for ``n = 1``.

Between a method and the reference method, on the ``n`` paired runs, ``d_i = x_i - r_i``:

* mean difference, its 95% t interval as above on the ``d_i``;
* paired t-test ``t = mean(d) / (s_d / sqrt(n))``, two-sided p (``scipy.stats.ttest_rel``);
* Wilcoxon signed-rank two-sided p (``scipy.stats.wilcoxon``) when ``n >= 6`` (below 6 pairs
  its smallest possible two-sided p is 0.0625, so it can never reject at 5%).

Undefined quantities (``n < 2``; zero variance for the tests) are ``None``, never 0 or NaN, so
they survive JSON and cannot be mistaken for a measurement. All functions are O(n).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
MIN_WILCOXON = 6


def _finite_or_none(x) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> dict:
    """Mean, std, n and the Student-t confidence interval of ``values`` (1-D, finite).

    Returns ``{"n", "mean", "std", "ci_low", "ci_high", "ci_half_width"}``; ``std`` and the
    interval are ``None`` for ``n = 1`` (no spread can be estimated from one run). A zero
    standard deviation with ``n >= 2`` gives a zero-width interval (identical runs).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"t_interval: need a non-empty 1-D sequence, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"t_interval: non-finite values {x.tolist()}")
    n = int(x.size)
    mean = float(x.mean())
    out = {"n": n, "mean": mean, "std": None, "ci_low": None, "ci_high": None}
    out["ci_half_width"] = None
    if n >= 2:
        std = float(x.std(ddof=1))
        half = float(stats.t.ppf(0.5 + confidence / 2, df=n - 1) * std / math.sqrt(n))
        out.update(std=std, ci_low=mean - half, ci_high=mean + half, ci_half_width=half)
    return out


def paired_difference(
    values: Sequence[float], reference: Sequence[float], confidence: float = CONFIDENCE
) -> dict:
    """Paired comparison of ``values`` against ``reference`` (same length, same run order).

    Returns the :func:`t_interval` of ``d = values - reference`` plus ``t`` and ``p_ttest``
    (``scipy.stats.ttest_rel``, two-sided), ``p_wilcoxon`` (``scipy.stats.wilcoxon``, two-sided,
    only when ``n >= 6`` and some ``d != 0``) and ``ci_excludes_zero`` (``None`` when there is no
    interval). With zero variance of ``d`` the t-test is undefined: ``t``/``p_ttest`` are None.
    """
    a = np.asarray(values, dtype=np.float64)
    b = np.asarray(reference, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired_difference: shapes differ, {a.shape} vs {b.shape}")
    out = t_interval(a - b, confidence)
    out.update(t=None, p_ttest=None, p_wilcoxon=None, ci_excludes_zero=None)
    n = out["n"]
    if n >= 2:
        out["ci_excludes_zero"] = bool(out["ci_low"] > 0 or out["ci_high"] < 0)
        if out["std"] > 0:
            res = stats.ttest_rel(a, b)
            out["t"] = _finite_or_none(res.statistic)
            out["p_ttest"] = _finite_or_none(res.pvalue)
    if n >= MIN_WILCOXON and np.any(a != b):
        out["p_wilcoxon"] = _finite_or_none(stats.wilcoxon(a, b).pvalue)
    return out


def describe_runs(
    runs: Mapping[str, Mapping[str, Mapping[str, float]]],
    metrics: Sequence[str],
    reference: str | None = None,
) -> dict:
    """Statistics of ``runs[method][run_id][metric]`` (successful runs only).

    Returns ``{"reference": name, "stats": {method: {metric: t_interval + values + run_ids}},
    "differences": {method: {metric: paired_difference + run_ids}}}``. Differences are against
    ``reference`` (default: the first method), on the run ids both methods have; the reference
    itself and methods without shared runs get no entry.
    """
    methods = list(runs)
    if reference is None and methods:
        reference = methods[0]
    if reference is not None and reference not in runs:
        raise ValueError(f"reference {reference!r} is not one of the methods {methods}")
    out: dict = {"reference": reference, "confidence": CONFIDENCE, "stats": {}, "differences": {}}
    for method, by_run in runs.items():
        row = {}
        for metric in metrics:
            ids = [r for r, m in by_run.items() if _has(m, metric)]
            if not ids:
                continue
            vals = [float(by_run[r][metric]) for r in ids]
            row[metric] = {**t_interval(vals), "values": vals, "run_ids": ids}
        out["stats"][method] = row
    if reference is None:
        return out
    ref_runs = runs[reference]
    for method, by_run in runs.items():
        if method == reference:
            continue
        row = {}
        for metric in metrics:
            ids = [r for r in by_run if _has(by_run[r], metric) and _has(ref_runs.get(r), metric)]
            if not ids:
                continue
            a = [float(by_run[r][metric]) for r in ids]
            b = [float(ref_runs[r][metric]) for r in ids]
            row[metric] = {**paired_difference(a, b), "run_ids": ids}
        out["differences"][method] = row
    return out


def _has(m: Mapping | None, metric: str) -> bool:
    return m is not None and m.get(metric) is not None and math.isfinite(float(m[metric]))


def _format_interval(st: dict | None, scale: float, digits: int, sign: str, star: str) -> str:
    if not st:
        return "-"
    mean = f"{scale * st['mean']:{sign}.{digits}f}"
    if st["ci_half_width"] is None:
        return f"{mean} (n={st['n']}, no CI)"
    return f"{mean} ± {scale * st['ci_half_width']:.{digits}f}{star}"


def format_mean_ci(st: dict | None, scale: float = 100.0, digits: int = 2) -> str:
    """``"61.46 ± 1.23"``; ``"61.46 (n=1, no CI)"`` for one run; ``"-"`` when missing."""
    return _format_interval(st, scale, digits, "", "")


def format_difference(d: dict | None, scale: float = 100.0, digits: int = 2) -> str:
    """``"+1.20 ± 0.80 *"`` (``*``: the 95% CI excludes 0); ``"+1.20 (n=1, no CI)"``."""
    star = " *" if d and d["ci_excludes_zero"] else ""
    return _format_interval(d, scale, digits, "+", star)


def format_p(p: float | None) -> str:
    if p is None:
        return "-"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"
